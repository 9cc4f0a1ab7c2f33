"""The node watch: what admission sees of a node (its skip labels among it), and the
observations it records, again whenever a skip label comes or goes."""

from __future__ import annotations

from typing import Any, cast

from gpuop.bus import InMemoryBus
from gpuop.events import kube as observed
from gpuop.events.driver import Component
from gpuop.kube import client
from gpuop.saga import NodeStatus
from gpuop.services.upgrade_orchestrator.observing import NodeWatcher
from tests.support.orchestrator import events, messages

OFED_SKIP = "nvidia.com/ofed-driver-upgrade.skip"


def node(version: int, *, unschedulable: bool = False, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-a",
            "uid": "uid-a",
            "resourceVersion": str(version),
            "labels": {"nvidia.com/gpu.present": "true", **labels},
        },
        "spec": {"unschedulable": unschedulable},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


async def observations(bus: InMemoryBus) -> list[observed.NodeObserved]:
    found = await messages(bus, events(bus.prefix, "kube", "gpu-a", "node-observed"))
    return [payload for _, payload in found if isinstance(payload, observed.NodeObserved)]


async def test_skip_labels_reach_admission_and_each_change_is_observed(bus: InMemoryBus) -> None:
    watcher = NodeWatcher(bus, cast(client.Kube, None))

    await watcher._observed("gpu-a", node(1))
    await watcher._observed("gpu-a", node(2, team="ml"))  # nothing gpuop acts on
    await watcher._observed("gpu-a", node(3, **{OFED_SKIP: "true"}))
    skipping = watcher.statuses["gpu-a"]
    await watcher._observed("gpu-a", node(4, unschedulable=True))  # the label removed

    assert skipping == NodeStatus(skip=frozenset({Component.OFED}))
    assert watcher.statuses["gpu-a"] == NodeStatus(unschedulable=True)
    seen = await observations(bus)
    assert len(seen) == 3
    assert seen[1].labels == {OFED_SKIP: "true"}  # the log shows why the node waited
    assert seen[2].labels == {} and seen[2].unschedulable


async def test_a_change_of_the_replacement_label_is_observed(bus: InMemoryBus) -> None:
    """A repair flow releases a node held for new hardware by this label alone."""
    watcher = NodeWatcher(bus, cast(client.Kube, None))
    label = "gpuop.io/hardware-replacement"

    await watcher._observed("gpu-a", node(1, unschedulable=True, **{label: "required"}))
    await watcher._observed("gpu-a", node(2, unschedulable=True, **{label: "done"}))

    seen = await observations(bus)
    assert [s.labels.get(label) for s in seen] == ["required", "done"]
