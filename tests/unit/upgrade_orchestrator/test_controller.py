"""The controller's reconcile under the operator's rollout controls: the policy's
`nodeSelector` picks the nodes that get a saga, `paused` admits nothing (and says so in the
`Progressing` condition), and a newer version replaces sagas that were never admitted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from gpuop.bus import Buckets, InMemoryBus
from gpuop.events import hardware, subjects
from gpuop.events.upgrade import NodeAdmitted, SagaStarted, UpgradeState
from gpuop.kube import client
from gpuop.policy import ComponentSpec, Condition, GPUClusterPolicySpec
from gpuop.policy.conditions import RolloutRecord
from gpuop.saga import NodeStatus, actions
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.controller import Controller
from gpuop.services.upgrade_orchestrator.rollouts import rollout_id_for
from tests.support.orchestrator import Stack, events, messages
from tests.support.sagas import BOOT_A, inventory, policy

S = UpgradeState
POOLS = {"gpu-a": "train", "gpu-b": "train", "gpu-c": "infer", "gpu-d": "infer"}


class Harness:
    """A controller whose watchers are filled in by the test, on the in-memory bus."""

    def __init__(self, bus: InMemoryBus, stack: Stack) -> None:
        self.bus = bus
        self.stack = stack
        self.controller = Controller(
            bus, cast(client.Kube, None), OrchestratorConfig(), clock=stack.clock
        )
        self.conditions: list[Condition] = []
        nodes = self.controller.nodes
        nodes.statuses = {name: NodeStatus() for name in POOLS}
        nodes.labels = {name: {"pool": pool} for name, pool in POOLS.items()}
        nodes.synced = True

        async def write_status(
            *conditions: Condition, nodes: Any = None, rollout: RolloutRecord | None = None
        ) -> None:
            self.conditions.extend(conditions)
            policies = self.controller.policies
            policies._status = policies._status.model_copy(update={"rollout": rollout})

        self.controller.policies.write_status = write_status  # type: ignore[method-assign]

    async def reconcile(self, spec: GPUClusterPolicySpec) -> None:
        self.stack.policy = spec
        policies = self.controller.policies
        if spec != policies.spec:
            policies.generation = (policies.generation or 0) + 1
        policies.spec = policies.in_force = spec
        stack = self.stack
        assert stack.store is not None and stack.runner is not None and stack.deadlines
        inventories = await self.bus.kv(Buckets.NODES)
        await self.controller.reconcile(stack.store, inventories, stack.runner, stack.deadlines)

    async def published(self, kind: type[Any]) -> list[tuple[str, Any]]:
        found = await messages(self.bus, events(self.bus.prefix, "upgrade"))
        return [(e.node, p) for e, p in found if isinstance(p, kind)]

    def progressing(self) -> Condition:
        return [c for c in self.conditions if c.type == "Progressing"][-1]


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    bus = InMemoryBus()
    await bus.start()
    stack = Stack(bus, policy())
    await stack.start()
    inventories = await bus.kv(Buckets.NODES)
    for name in POOLS:
        found = inventory(BOOT_A)
        assert isinstance(found, hardware.HardwareDiscovered)
        await inventories.put(subjects.encode_node(name), found.model_dump_json().encode())
    yield Harness(bus, stack)
    await stack.stop()
    await bus.close()


def spec(**upgrade: Any) -> GPUClusterPolicySpec:
    return policy(max_parallel_upgrades=0, max_unavailable="100%", **upgrade)


async def test_the_node_selector_picks_the_nodes_a_rollout_manages(harness: Harness) -> None:
    await harness.reconcile(spec(node_selector="pool=train"))

    started = await harness.published(SagaStarted)
    assert sorted(node for node, _ in started) == ["gpu-a", "gpu-b"]
    admitted = await harness.published(NodeAdmitted)
    assert sorted(node for node, _ in admitted) == ["gpu-a", "gpu-b"]
    assert harness.progressing().message == "0 of 2 nodes upgraded"


async def test_a_paused_policy_starts_sagas_but_admits_nothing(harness: Harness) -> None:
    await harness.reconcile(spec(paused=True))

    assert len(await harness.published(SagaStarted)) == 4
    assert await harness.published(NodeAdmitted) == []

    def waiting_labels() -> list[actions.SetStateLabel]:
        done = [action for _, action in harness.stack.kube.done]
        labels = [a for a in done if isinstance(a, actions.SetStateLabel)]
        return [label for label in labels if label.value is S.UPGRADE_REQUIRED]

    async with asyncio.timeout(5):  # every waiting node says so, as upstream's label does
        while len(waiting_labels()) < 4:
            await asyncio.sleep(0.01)
    progressing = harness.progressing()
    assert (progressing.status, progressing.reason) == ("Unknown", "RolloutPaused")
    assert "gpuop upgrade resume" in progressing.message

    await harness.reconcile(spec())
    assert len(await harness.published(NodeAdmitted)) == 4
    assert harness.progressing().reason == "RolloutInProgress"


async def test_a_new_version_replaces_sagas_never_admitted_and_waits_for_the_others(
    harness: Harness,
) -> None:
    first = spec(paused=True)
    await harness.reconcile(first)
    store = harness.stack.store
    assert store is not None
    busy = await store.get("gpu-a")
    assert busy is not None
    under_way = busy.saga.model_copy(update={"state": S.DRAIN_REQUIRED, "cordoned": True})
    await store.replace(under_way, busy.revision)

    newer = first.model_copy(
        update={
            "driver": first.driver.model_copy(update={"gpu": ComponentSpec(version="590.1")}),
            "upgrade_policy": first.upgrade_policy.model_copy(update={"paused": False}),
        }
    )
    await harness.reconcile(newer)

    sagas = {entry.saga.node: entry.saga for entry in await store.all()}
    assert sagas["gpu-a"].rollout_id == rollout_id_for(first)  # finishes its window first
    for node in ("gpu-b", "gpu-c", "gpu-d"):
        assert sagas[node].rollout_id == rollout_id_for(newer, 2)
    admitted = sorted(node for node, _ in await harness.published(NodeAdmitted))
    assert admitted == ["gpu-b", "gpu-c", "gpu-d"]


async def test_versions_that_come_back_are_a_new_rollout_with_ids_of_its_own(
    harness: Harness,
) -> None:
    first = spec(paused=True)
    await harness.reconcile(first)
    other = first.model_copy(
        update={"driver": first.driver.model_copy(update={"gpu": ComponentSpec(version="590.1")})}
    )
    await harness.reconcile(other)
    back = first.model_copy(
        update={"upgrade_policy": first.upgrade_policy.model_copy(update={"paused": False})}
    )
    await harness.reconcile(back)  # generation 3: the versions of the first rollout again

    started = {p.rollout_id for _, p in await harness.published(SagaStarted)}
    assert started == {
        rollout_id_for(first),
        rollout_id_for(other, 2),
        rollout_id_for(first, 3),
    }
    assert len(await harness.published(NodeAdmitted)) == 4
