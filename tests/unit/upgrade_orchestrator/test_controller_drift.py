"""The reconcile starts a saga for a node that lost its driver, without a policy change: a
kernel drift after its saga of this rollout was done (a saga with an id of its own), or no
driver at all; a node without GPU pods is brought up without a slot, one with GPU pods takes
the upgrade path; an inventory the done saga already saw starts nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from gpuop.bus import Buckets, InMemoryBus
from gpuop.events import hardware, subjects
from gpuop.events.upgrade import NodeAdmitted, SagaReason, SagaStarted, UpgradeState
from gpuop.kube import client
from gpuop.policy import Condition, GPUClusterPolicySpec
from gpuop.policy.conditions import RolloutRecord
from gpuop.saga import NodeStatus, actions
from gpuop.saga.upgrade import records
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.controller import Controller
from gpuop.services.upgrade_orchestrator.rollouts import rollout_id_for
from tests.support.orchestrator import Stack, events, messages
from tests.support.sagas import BOOT_A, BOOT_B, GPU_NEW, OFED_OLD, T0, policy

S = UpgradeState
KERNEL_OLD, KERNEL_NEW = "6.1.0-41-amd64", "6.1.0-44-amd64"
NODES = ("gpu-a", "gpu-b", "gpu-c")


def inventory(boot: str, kernel: str, gpu: str | None) -> hardware.HardwareDiscovered:
    draft = hardware.HardwareDiscovered(
        kernel_release=kernel, machine="x86_64", boot_id=boot, driver_version=gpu,
        ofed_version=OFED_OLD, inventory_hash="0" * 64,
    )  # fmt: skip
    return draft.model_copy(update={"inventory_hash": draft.content_hash()})


class Harness:
    def __init__(self, bus: InMemoryBus, stack: Stack) -> None:
        self.bus, self.stack = bus, stack
        self.gpu_pods: set[str] = set()
        self.asked: list[str] = []

        async def has_gpu_pods(node: str) -> bool:
            self.asked.append(node)
            return node in self.gpu_pods

        self.controller = Controller(
            bus, cast(client.Kube, None), OrchestratorConfig(), clock=stack.clock,
            has_gpu_pods=has_gpu_pods,
        )  # fmt: skip
        nodes = self.controller.nodes
        nodes.statuses = {name: NodeStatus() for name in NODES}
        nodes.labels = {name: {} for name in NODES}
        nodes.synced = True

        async def write_status(*conditions: Condition, **_: Any) -> None:
            rollout: RolloutRecord | None = _.get("rollout")
            policies = self.controller.policies
            policies._status = policies._status.model_copy(update={"rollout": rollout})

        self.controller.policies.write_status = write_status  # type: ignore[method-assign]

    async def report(self, node: str, found: hardware.HardwareDiscovered) -> None:
        kv = await self.bus.kv(Buckets.NODES)
        await kv.put(subjects.encode_node(node), found.model_dump_json().encode())

    async def reconcile(self, spec: GPUClusterPolicySpec) -> None:
        self.stack.policy = spec
        policies = self.controller.policies
        if spec != policies.spec:
            policies.generation = (policies.generation or 0) + 1
        policies.spec = policies.in_force = spec
        stack = self.stack
        assert stack.store is not None and stack.runner is not None and stack.deadlines
        kv = await self.bus.kv(Buckets.NODES)
        await self.controller.reconcile(stack.store, kv, stack.runner, stack.deadlines)

    async def published(self, kind: type[Any]) -> list[tuple[str, Any]]:
        found = await messages(self.bus, events(self.bus.prefix, "upgrade"))
        return [(e.node, p) for e, p in found if isinstance(p, kind)]

    async def done(self, node: str, spec: GPUClusterPolicySpec, seen: str) -> None:
        """Store `node`'s saga of the rollout as done on KERNEL_OLD, having seen `seen`."""
        running = {records.Component.GPU: "570.1", records.Component.OFED: OFED_OLD}
        saga = records.new_saga(
            node=node, rollout_id=rollout_id_for(spec), policy=spec, running=running, now=T0,
            kernel_release=KERNEL_OLD,
        ).model_copy(update={"state": S.UPGRADE_DONE, "inventory_hash": seen})  # fmt: skip
        assert self.stack.store is not None
        await self.stack.store.create(saga)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    bus = InMemoryBus()
    await bus.start()
    stack = Stack(bus, policy())
    await stack.start()
    yield Harness(bus, stack)
    await stack.stop()
    await bus.close()


def spec() -> GPUClusterPolicySpec:
    return policy(max_parallel_upgrades=1, max_unavailable=1)


async def test_a_kernel_drift_after_the_rollout_starts_a_reinstall_of_its_own(
    harness: Harness,
) -> None:
    policy_ = spec()
    current = inventory(BOOT_A, KERNEL_OLD, GPU_NEW)
    for node in NODES:
        await harness.report(node, current)
        await harness.done(node, policy_, current.inventory_hash)
    await harness.reconcile(policy_)
    assert await harness.published(SagaStarted) == []

    harness.gpu_pods = {"gpu-a"}
    await harness.report("gpu-a", inventory(BOOT_B, KERNEL_NEW, None))
    await harness.report("gpu-b", inventory(BOOT_B, KERNEL_NEW, None))
    await harness.report("gpu-c", inventory(BOOT_B, KERNEL_NEW, GPU_NEW))  # pre-staged
    await harness.reconcile(policy_)

    started = dict(await harness.published(SagaStarted))
    assert sorted(started) == ["gpu-a", "gpu-b"]
    for node, payload in started.items():
        assert payload.reason is SagaReason.KERNEL_DRIFT
        assert payload.kernel_release == KERNEL_NEW
        assert payload.saga_id != records.saga_id_for(rollout_id_for(policy_), node)
        assert payload.saga_id.startswith(f"{rollout_id_for(policy_)}/{node}/kernel-drift-")
    assert started["gpu-a"].bring_up is False  # its GPU pods are moved as in an upgrade
    assert started["gpu-b"].bring_up is True
    assert sorted(harness.asked) == ["gpu-a", "gpu-b"]
    assert harness.stack.store is not None
    saga = await harness.stack.store.get("gpu-b")
    assert saga is not None and saga.saga.reason is SagaReason.KERNEL_DRIFT


async def test_an_inventory_the_done_saga_saw_starts_nothing(harness: Harness) -> None:
    policy_ = spec()
    reloading = inventory(BOOT_A, KERNEL_OLD, None)  # taken while the saga reloaded
    await harness.report("gpu-a", reloading)
    await harness.done("gpu-a", policy_, reloading.inventory_hash)
    for node in NODES[1:]:
        await harness.report(node, inventory(BOOT_A, KERNEL_OLD, GPU_NEW))
        await harness.done(node, policy_, "f" * 64)
    await harness.reconcile(policy_)
    assert await harness.published(SagaStarted) == []


async def test_a_new_node_is_brought_up_while_the_rollout_holds_every_slot(
    harness: Harness,
) -> None:
    for node in ("gpu-a", "gpu-b"):
        await harness.report(node, inventory(BOOT_A, KERNEL_OLD, "570.1"))
    await harness.reconcile(spec())
    admitted = [node for node, _ in await harness.published(NodeAdmitted)]
    assert admitted == ["gpu-a"]  # the one slot

    await harness.report("gpu-c", inventory(BOOT_A, KERNEL_NEW, None))
    await harness.reconcile(spec())
    started = dict(await harness.published(SagaStarted))
    assert started["gpu-c"].reason is SagaReason.NO_DRIVER and started["gpu-c"].bring_up
    admitted = [node for node, _ in await harness.published(NodeAdmitted)]
    assert admitted == ["gpu-a", "gpu-c"]
    assert harness.stack.outbox is not None
    await harness.stack.outbox.idle()
    tainted = [a for n, a in harness.stack.kube.done if n == "gpu-c"]
    assert any(isinstance(a, actions.Taint) for a in tainted)
    assert not any(isinstance(a, actions.Taint) for n, a in harness.stack.kube.done if n != "gpu-c")
