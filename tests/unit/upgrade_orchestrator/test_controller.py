"""The controller's reconcile under the operator's rollout controls: the policy's
`nodeSelector` picks the nodes that get a saga, `paused` admits nothing (and says so in the
`Progressing` condition), a newer version replaces sagas that were never admitted, and
nodes with a skip label (or cordoned, with `cordonedNodes: skip`) are never admitted and
are counted as skipped in the status and the rollout's progress."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from gpuop.bus import Buckets, InMemoryBus
from gpuop.events import hardware, subjects
from gpuop.events.driver import Component, Flavour
from gpuop.events.upgrade import NodeAdmitted, RolloutProgress, SagaStarted, UpgradeState
from gpuop.kube import client
from gpuop.policy import ComponentSpec, Condition, GPUClusterPolicySpec
from gpuop.policy.conditions import PoolProgress, RolloutRecord
from gpuop.policy.drivers import DriverPool, GpuComponentSpec, PoolUpgradePolicy
from gpuop.saga import NodeStatus, actions, admission
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.controller import Controller
from gpuop.services.upgrade_orchestrator.rollouts import rollout_id_for
from tests.support.orchestrator import Stack, events, messages
from tests.support.sagas import BOOT_A, GPU_NEW, SOURCE, inventory, policy

S = UpgradeState
OPEN, PROPRIETARY = Flavour.OPEN, Flavour.PROPRIETARY
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
        self.skipped: list[int | None] = []
        self.pools: list[tuple[PoolProgress, ...]] = []
        nodes = self.controller.nodes
        nodes.statuses = {name: NodeStatus() for name in POOLS}
        nodes.labels = {name: {"pool": pool} for name, pool in POOLS.items()}
        nodes.synced = True

        async def write_status(
            *conditions: Condition,
            nodes: Any = None,
            rollout: RolloutRecord | None = None,
            skipped: int | None = None,
            pools: tuple[PoolProgress, ...] | None = None,
            upgraded: str | None = None,
        ) -> None:
            self.conditions.extend(conditions)
            self.skipped.append(skipped)
            self.pools.append(pools or ())
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
    return policy(**{"max_parallel_upgrades": 0, "max_unavailable": "100%", **upgrade})


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
            "driver": first.driver.model_copy(update={"gpu": GpuComponentSpec(version="590.1")}),
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
        update={
            "driver": first.driver.model_copy(update={"gpu": GpuComponentSpec(version="590.1")})
        }
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


def skip_labelled(harness: Harness, node: str, *components: Component) -> None:
    """Label `node` with the skip labels of `components` (none: remove them), as the node
    watch would then see it."""
    nodes = harness.controller.nodes
    labels = {
        k: v for k, v in nodes.labels[node].items() if k not in admission.SKIP_LABELS.values()
    }
    labels |= {admission.SKIP_LABELS[c]: "true" for c in components}
    nodes.labels[node] = labels
    nodes.statuses[node] = NodeStatus(skip=admission.skipped_by(labels))


async def test_a_node_with_the_skip_label_is_never_admitted_and_counted_skipped(
    harness: Harness,
) -> None:
    skip_labelled(harness, "gpu-a", Component.GPU)
    await harness.reconcile(spec())
    await harness.reconcile(spec())  # again: still left out

    assert len(await harness.published(SagaStarted)) == 4  # it waits in upgrade-required
    admitted = sorted(node for node, _ in await harness.published(NodeAdmitted))
    assert admitted == ["gpu-b", "gpu-c", "gpu-d"]
    assert harness.skipped[-1] == 1
    assert harness.progressing().message == "0 of 4 nodes upgraded, 1 skipped"
    progress = [p for _, p in await harness.published(RolloutProgress)]
    assert progress[-1].skipped == 1
    assert progress[-1].counts == {S.UPGRADE_REQUIRED: 4}  # admissions not yet decided

    skip_labelled(harness, "gpu-a")  # the label removed: admitted at the next pass
    await harness.reconcile(spec())
    admitted = sorted(node for node, _ in await harness.published(NodeAdmitted))
    assert admitted == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    assert harness.skipped[-1] == 0


async def test_only_skipped_nodes_left_stop_the_rollout_progressing(harness: Harness) -> None:
    skip_labelled(harness, "gpu-a", Component.GPU)
    await harness.reconcile(spec())
    store = harness.stack.store
    assert store is not None
    for node in ("gpu-b", "gpu-c", "gpu-d"):
        stored = await store.get(node)
        assert stored is not None
        await store.replace(
            stored.saga.model_copy(update={"state": S.UPGRADE_DONE}), stored.revision
        )

    await harness.reconcile(spec())

    progressing = harness.progressing()
    assert (progressing.status, progressing.reason) == ("False", "NodesSkipped")
    assert progressing.message.startswith("3 of 4 nodes upgraded, 1 skipped: ")


async def test_cordoned_nodes_are_skipped_until_uncordoned_when_the_policy_says_so(
    harness: Harness,
) -> None:
    statuses = harness.controller.nodes.statuses
    statuses["gpu-a"] = NodeStatus(unschedulable=True)  # cordoned by an administrator
    await harness.reconcile(spec(max_parallel_upgrades=1, cordoned_nodes="skip"))

    admitted = [node for node, _ in await harness.published(NodeAdmitted)]
    assert admitted == ["gpu-b"]  # not the cordoned node first, as upgradeFirst would
    assert harness.skipped[-1] == 1

    statuses["gpu-a"] = NodeStatus()
    await harness.reconcile(spec(max_parallel_upgrades=0, cordoned_nodes="skip"))
    admitted = sorted(node for node, _ in await harness.published(NodeAdmitted))
    assert admitted == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    assert harness.skipped[-1] == 0


async def test_a_cordoned_node_goes_first_by_default(harness: Harness) -> None:
    harness.controller.nodes.statuses["gpu-d"] = NodeStatus(unschedulable=True)
    await harness.reconcile(spec(max_parallel_upgrades=1))

    admitted = [node for node, _ in await harness.published(NodeAdmitted)]
    assert admitted == ["gpu-d"]  # the cordoned one first, in the one slot
    assert harness.skipped[-1] == 0


def pooled(**upgrade: Any) -> GPUClusterPolicySpec:
    """The train nodes in a pool of their own with an older driver; the others default."""
    base = spec(**upgrade)
    train = DriverPool(
        name="train",
        node_selector="pool=train",
        gpu=ComponentSpec(version="575.9", source=SOURCE),
        upgrade_policy=PoolUpgradePolicy(max_parallel_upgrades=1),
    )
    return base.model_copy(update={"driver": base.driver.model_copy(update={"pools": (train,)})})


async def test_a_pools_nodes_start_sagas_for_its_drivers_and_status_counts_per_pool(
    harness: Harness,
) -> None:
    wanted = pooled()
    await harness.reconcile(wanted)

    started = dict(await harness.published(SagaStarted))
    assert {node: s.pool for node, s in started.items()} == {
        "gpu-a": "train", "gpu-b": "train", "gpu-c": None, "gpu-d": None,
    }  # fmt: skip
    store = harness.stack.store
    assert store is not None
    sagas = {entry.saga.node: entry.saga for entry in await store.all()}
    assert sagas["gpu-a"].targets[Component.GPU].version == "575.9"
    assert sagas["gpu-c"].targets[Component.GPU].version == GPU_NEW
    admitted = sorted(node for node, _ in await harness.published(NodeAdmitted))
    assert admitted == ["gpu-a", "gpu-c", "gpu-d"]  # the train pool one at a time
    progress = {p.name: (p.done, p.total, p.versions) for p in harness.pools[-1]}
    assert progress == {
        "default": (0, 2, {"gpu": GPU_NEW}),
        "train": (0, 2, {"gpu": "575.9"}),
    }
    assert rollout_id_for(wanted).startswith(f"rollout-gpu-{GPU_NEW}-pools-")


async def test_a_change_of_one_pools_driver_is_a_new_rollout(harness: Harness) -> None:
    first = pooled(paused=True)
    await harness.reconcile(first)
    (train,) = first.driver.pools
    newer_pool = train.model_copy(update={"gpu": GpuComponentSpec(version="576.1")})
    newer = first.model_copy(
        update={"driver": first.driver.model_copy(update={"pools": (newer_pool,)})}
    )
    assert rollout_id_for(newer) != rollout_id_for(first)
    await harness.reconcile(newer)

    store = harness.stack.store
    assert store is not None
    sagas = {entry.saga.node: entry.saga for entry in await store.all()}
    assert sagas["gpu-a"].targets[Component.GPU].version == "576.1"
    assert sagas["gpu-a"].rollout_id == rollout_id_for(newer, 2)


async def test_a_waiting_node_that_moves_to_another_pool_gets_that_pools_saga(
    harness: Harness,
) -> None:
    wanted = pooled(paused=True)
    await harness.reconcile(wanted)
    harness.controller.nodes.labels["gpu-c"] = {"pool": "train"}
    await harness.reconcile(wanted)

    store = harness.stack.store
    assert store is not None
    moved = await store.get("gpu-c")
    assert moved is not None and moved.saga.pool == "train"
    assert moved.saga.targets[Component.GPU].version == "575.9"


def flavoured(
    gpu: str | None, flavour: Flavour | None, *devices: str
) -> hardware.HardwareDiscovered:
    """An inventory running GPU driver `gpu` of `flavour`, with NVIDIA GPUs of PCI `devices`
    (no NVML answers: their architecture comes from the device id)."""
    found = inventory(BOOT_A, gpu=gpu)
    assert isinstance(found, hardware.HardwareDiscovered)
    functions = tuple(
        hardware.PciFunction(
            address=f"0000:00:{6 + index:02x}.0",
            vendor_id="10de",
            device_id=device,
            class_id="030200",
            subsystem_vendor_id="10de",
            subsystem_device_id="18bf",
        )
        for index, device in enumerate(devices)
    )
    draft = found.model_copy(update={"driver_flavour": flavour, "pci_functions": functions})
    return draft.model_copy(update={"inventory_hash": draft.content_hash()})


async def put_inventories(harness: Harness, found: dict[str, hardware.HardwareDiscovered]) -> None:
    inventories = await harness.bus.kv(Buckets.NODES)
    for name, one in found.items():
        await inventories.put(subjects.encode_node(name), one.model_dump_json().encode())


def kernel_modules(kernel_module_type: str) -> GPUClusterPolicySpec:
    first = spec(paused=True)
    gpu = first.driver.gpu.model_copy(update={"kernel_module_type": kernel_module_type})
    return first.model_copy(update={"driver": first.driver.model_copy(update={"gpu": gpu})})


async def test_a_node_running_the_other_kernel_modules_of_the_version_gets_a_reload_saga(
    harness: Harness,
) -> None:
    await put_inventories(
        harness,
        {
            "gpu-a": flavoured(GPU_NEW, PROPRIETARY, "2335"),  # the version, the other modules
            "gpu-b": flavoured(GPU_NEW, OPEN, "2335"),  # the version and the modules
            "gpu-c": flavoured(GPU_NEW, None, "2335"),  # a discovery that does not say
            "gpu-d": flavoured("570.1", OPEN, "2335"),  # another version
        },
    )
    await harness.reconcile(kernel_modules("open"))

    started = dict(await harness.published(SagaStarted))
    assert sorted(started) == ["gpu-a", "gpu-d"]
    assert (started["gpu-a"].flavour, started["gpu-a"].running_flavour) == (OPEN, PROPRIETARY)
    assert started["gpu-a"].running_versions[Component.GPU] == GPU_NEW
    assert started["gpu-a"].reason == "version-change"  # reloaded as for a version change
    store = harness.stack.store
    assert store is not None
    saga = store.cached("gpu-a")
    assert saga is not None
    assert (saga.saga.targets[Component.GPU].flavour, saga.saga.previous_flavour) == (
        OPEN,
        PROPRIETARY,
    )


async def test_auto_resolves_each_nodes_flavour_from_its_gpus_and_the_branch(
    harness: Harness,
) -> None:
    await put_inventories(
        harness,
        {
            "gpu-a": flavoured(GPU_NEW, PROPRIETARY, "2335"),  # Hopper at 580: open recommended
            "gpu-b": flavoured(GPU_NEW, OPEN, "2335"),
            "gpu-c": flavoured(GPU_NEW, PROPRIETARY, "1db4"),  # Volta: proprietary only
            "gpu-d": flavoured(GPU_NEW, OPEN, "1db4"),
        },
    )
    await harness.reconcile(kernel_modules("auto"))

    started = dict(await harness.published(SagaStarted))
    assert {node: event.flavour for node, event in started.items()} == {
        "gpu-a": OPEN,
        "gpu-d": PROPRIETARY,
    }
