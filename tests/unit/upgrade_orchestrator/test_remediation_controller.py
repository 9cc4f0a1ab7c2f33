"""The controller runs the remediation kind beside the upgrades: its status carries the
circuit breaker's condition (`RemediationBreaker`, False within the limit, True with when it
reopens once tripped, False again an hour later), and a node held by a remediation is never
admitted to an upgrade."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, cast

import pytest

from gpuop.bus import Buckets, InMemoryBus
from gpuop.events import device as dev
from gpuop.events import hardware, subjects
from gpuop.events.upgrade import NodeAdmitted
from gpuop.kube import client
from gpuop.policy import Condition, GPUClusterPolicySpec
from gpuop.saga import NodeStatus
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.controller import Controller
from tests.support.orchestrator import Stack, events, messages
from tests.support.sagas import BOOT_A, T0, inventory, policy

NODES = ("gpu-a", "gpu-b")
GPU = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"


class Harness:
    def __init__(self, bus: InMemoryBus, stack: Stack) -> None:
        self.bus = bus
        self.stack = stack
        self.controller = Controller(
            bus, cast(client.Kube, None), OrchestratorConfig(), clock=stack.clock
        )
        self.conditions: list[Condition] = []
        nodes = self.controller.nodes
        nodes.statuses = {name: NodeStatus() for name in NODES}
        nodes.labels = {name: {} for name in NODES}
        nodes.synced = True

        async def write_status(*conditions: Condition, **_: Any) -> None:
            self.conditions.extend(conditions)

        self.controller.policies.write_status = write_status  # type: ignore[method-assign]

    async def reconcile(self, spec: GPUClusterPolicySpec) -> None:
        self.stack.policy = spec
        policies = self.controller.policies
        policies.spec = policies.in_force = spec
        policies.generation = 1
        stack = self.stack
        assert stack.store is not None and stack.runner is not None and stack.deadlines
        inventories = await self.bus.kv(Buckets.NODES)
        await self.controller.reconcile(stack.store, inventories, stack.runner, stack.deadlines)

    def breaker(self) -> Condition:
        return [c for c in self.conditions if c.type == "RemediationBreaker"][-1]


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    bus = InMemoryBus()
    await bus.start()
    stack = Stack(bus, policy())
    runner = await stack.start()
    assert stack.store is not None
    inventories = await bus.kv(Buckets.NODES)
    for name in NODES:
        found = inventory(BOOT_A)
        assert isinstance(found, hardware.HardwareDiscovered)
        await inventories.put(subjects.encode_node(name), found.model_dump_json().encode())
    running = Harness(bus, stack)
    runner.kinds = tuple(await running.controller.kind_runners(runner, stack.store, inventories))
    yield running
    await stack.stop()
    await bus.close()


def fault() -> dev.DeviceHealthChanged:
    return dev.DeviceHealthChanged(
        gpu_uuid=GPU, healthy=False, reason=dev.HealthReason.XID, xid=79,
        action=dev.XidAction.RESET_GPU,
    )  # fmt: skip


def limited(spec: GPUClusterPolicySpec, limit: int) -> GPUClusterPolicySpec:
    remediation = spec.remediation.model_copy(update={"max_per_hour": limit})
    return spec.model_copy(update={"remediation": remediation})


async def test_the_breaker_condition_follows_the_sliding_hour(harness: Harness) -> None:
    spec = limited(policy(max_unavailable="100%", max_parallel_upgrades=0), 1)
    runner = harness.stack.runner
    assert runner is not None
    await harness.reconcile(spec)
    assert (harness.breaker().status, harness.breaker().reason) == ("False", "WithinLimit")

    await runner.apply("gpu-a", fault(), T0)
    await runner.apply("gpu-b", fault(), T0 + timedelta(minutes=1))  # refused: 1 per hour
    await harness.reconcile(spec)
    tripped = harness.breaker()
    assert (tripped.status, tripped.reason) == ("True", "Tripped")
    assert (T0 + timedelta(hours=1)).isoformat() in tripped.message

    harness.stack.clock.advance(3601.0)
    await harness.reconcile(spec)
    assert harness.breaker().status == "False"


async def test_a_node_under_remediation_is_not_admitted_to_an_upgrade(harness: Harness) -> None:
    spec = policy(max_unavailable="100%", max_parallel_upgrades=0)
    runner = harness.stack.runner
    assert runner is not None
    await runner.apply("gpu-a", fault(), T0)
    await harness.reconcile(spec)

    admitted = await messages(harness.bus, events(harness.bus.prefix, "upgrade", name="admitted"))
    by_node = {e.node: p for e, p in admitted if isinstance(p, NodeAdmitted)}
    assert by_node["gpu-a"].saga_id.startswith("remediation/")  # its remediation, no upgrade
    assert by_node["gpu-b"].saga_id.startswith("rollout")
