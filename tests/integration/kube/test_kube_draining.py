"""Drain like `kubectl drain`: what is skipped, what is refused, evictions against
PodDisruptionBudgets until the deadline, and waiting for the pods to be gone."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from gpuop.clocks import VirtualClock
from gpuop.events.driver import Component
from gpuop.kube import budgets, client, draining, errors, pods
from gpuop.kube.draining import DrainOptions, SkipReason
from gpuop.kube.pods import PodRef
from gpuop_sim import ApiServer
from tests.support import kube_objects as support

EMPTY_DIR = [{"name": "scratch", "emptyDir": {}}]


def names(refs: tuple[PodRef, ...] | list[PodRef]) -> list[str]:
    return sorted(ref.name for ref in refs)


def evictions(server: ApiServer) -> list[tuple[str, int]]:
    return [
        (record.path.split("/")[-2], record.status)
        for record in server.request_log
        if record.path.endswith("/eviction")
    ]


async def remaining(kube: client.Kube) -> list[str]:
    return [pod["metadata"]["name"] for pod in await pods.on_node(kube, "node-1")]


async def test_evicts_workloads_and_skips_daemonset_mirror_and_opted_out_pods(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("web"))
    server.seed(support.pod("train", resources=support.gpus()))
    server.seed(support.pod("device-plugin", owner="DaemonSet"))
    server.seed(support.pod("static", owner="Node", annotations={draining.MIRROR_ANNOTATION: "x"}))
    server.seed(support.pod("operator", labels={draining.skip_label("gpu"): "true"}))
    server.seed(support.pod("nic-agent", labels={draining.skip_label("ofed"): "true"}))
    server.seed(support.pod("elsewhere", node="node-2"))

    result = await draining.drain_node(kube, "node-1")

    assert names(result.evicted) == ["train", "web"]
    assert {(s.pod.name, s.reason) for s in result.skipped} == {
        ("device-plugin", SkipReason.DAEMONSET),
        ("static", SkipReason.MIRROR),
        ("operator", SkipReason.SKIP_LABEL),
        ("nic-agent", SkipReason.SKIP_LABEL),
    }
    assert sorted(await remaining(kube)) == ["device-plugin", "nic-agent", "operator", "static"]
    assert sorted(evictions(server)) == [("train", 201), ("web", 201)]


async def test_finished_daemonset_pods_are_removed(server: ApiServer, kube: client.Kube) -> None:
    server.seed(support.pod("old-driver", owner="DaemonSet", phase="Failed"))

    result = await draining.drain_node(kube, "node-1")

    assert names(result.evicted) == ["old-driver"]


async def test_emptydir_pods_refuse_the_drain_without_the_option(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("cache", volumes=EMPTY_DIR))
    server.seed(support.pod("web"))

    with pytest.raises(errors.DrainRefused) as refused:
        await draining.drain_node(kube, "node-1")

    assert refused.value.pods == ("default/cache",)
    assert "emptyDir" in refused.value.reason
    assert evictions(server) == []  # nothing is evicted when anything is refused
    assert sorted(await remaining(kube)) == ["cache", "web"]


async def test_emptydir_pods_are_evicted_with_delete_emptydir(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("cache", volumes=EMPTY_DIR))

    result = await draining.drain_node(kube, "node-1", DrainOptions(delete_emptydir=True))

    assert names(result.evicted) == ["cache"]


async def test_unmanaged_pods_refuse_the_drain_without_force(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("bare", owner=None))
    server.seed(support.pod("cache", volumes=EMPTY_DIR))
    server.seed(support.pod("finished-bare", owner=None, phase="Succeeded"))

    with pytest.raises(errors.DrainRefused) as refused:
        await draining.drain_node(kube, "node-1")

    assert refused.value.pods == ("default/bare", "default/cache")
    assert "no controller" in refused.value.reason
    assert "force" in str(refused.value)
    assert evictions(server) == []


async def test_unmanaged_pods_are_evicted_with_force(server: ApiServer, kube: client.Kube) -> None:
    server.seed(support.pod("bare", owner=None))

    result = await draining.drain_node(kube, "node-1", DrainOptions(force=True))

    assert names(result.evicted) == ["bare"]
    assert await remaining(kube) == []


async def test_a_pdb_blocked_drain_ends_at_its_timeout_naming_the_pdb(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("db-0", labels={"app": "db"}))
    server.seed(support.pdb("db-budget", {"app": "db"}, min_available=1))
    server.seed(support.pod("web"))
    clock = VirtualClock()

    with pytest.raises(errors.DrainTimedOut) as timed_out:
        await draining.drain_node(kube, "node-1", DrainOptions(timeout=300), clock=clock)

    assert timed_out.value.pdb == "default/db-budget"
    assert timed_out.value.pods == ("default/db-0",)
    assert "db-budget" in str(timed_out.value)
    assert 300 <= clock.monotonic() < 306
    blocked = [status for name, status in evictions(server) if name == "db-0"]
    assert set(blocked) == {429}
    assert len(blocked) == 300 // 5 + 1  # retried every retry_interval until the deadline
    assert sorted(await remaining(kube)) == ["db-0"]  # web was evicted meanwhile


async def test_a_budget_still_being_processed_is_named_too(
    server: ApiServer, kube: client.Kube
) -> None:
    server.pause_pdb_controller()
    server.seed(support.pod("db-0", labels={"app": "db"}))
    server.seed(support.pdb("new-budget", {"app": "db"}, min_available=0))

    with pytest.raises(errors.DrainTimedOut) as timed_out:
        await draining.drain_node(kube, "node-1", DrainOptions(timeout=20), clock=VirtualClock())

    assert timed_out.value.pdbs == ("default/new-budget",)


async def test_a_refused_eviction_succeeds_once_the_budget_allows_it(
    server: ApiServer, kube: client.Kube
) -> None:
    """Three replicas, at least two available: one eviction at a time, each waiting for
    the replacement of the previous one to become healthy elsewhere."""
    for index, node in enumerate(("node-1", "node-1", "node-2")):
        server.seed(support.pod(f"db-{index}", node=node, labels={"app": "db"}))
    server.seed(support.pdb("db-budget", {"app": "db"}, min_available=2))

    async def replicaset() -> None:
        replaced: set[str] = set()
        while len(replaced) < 2:
            present = set(await remaining(kube))
            for gone in {"db-0", "db-1"} - present - replaced:
                replaced.add(gone)
                server.seed(support.pod(f"{gone}-new", node="node-2", labels={"app": "db"}))
            await asyncio.sleep(0.01)

    replacing = asyncio.create_task(replicaset())
    result = await draining.drain_node(kube, "node-1", DrainOptions(retry_interval=0.02, timeout=5))
    await replacing

    assert names(result.evicted) == ["db-0", "db-1"]
    assert await remaining(kube) == []
    statuses = [status for _, status in evictions(server)]
    assert statuses.count(201) == 2
    assert 429 in statuses


async def test_the_blocking_budget_is_found_by_selector_when_the_429_names_none(
    server: ApiServer, kube: client.Kube
) -> None:
    pod = server.seed(support.pod("db-0", labels={"app": "db", "tier": "data"}))
    server.seed(support.pdb("other", {"app": "web"}, min_available=1))
    server.seed(support.pdb("db-budget", {"tier": "data"}, min_available=1))
    bare = errors.TooManyRequests("Cannot evict pod as it would violate the budget.", code=429)

    assert budgets.named_in(bare) is None
    assert await budgets.blocking(kube, pod, bare) == "default/db-budget"


@pytest.mark.parametrize("kubelet_delay", [None])
async def test_the_drain_waits_for_evicted_pods_to_be_gone(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("slow"))

    async def kubelet() -> None:
        while not pods.is_terminating((await pods.on_node(kube, "node-1"))[0]):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        server.complete_pod_termination("default", "slow")

    confirming = asyncio.create_task(kubelet())
    result = await draining.drain_node(kube, "node-1", DrainOptions(timeout=5))
    await confirming

    assert names(result.evicted) == ["slow"]
    assert await remaining(kube) == []


@pytest.mark.parametrize("kubelet_delay", [None])
async def test_the_wait_for_evicted_pods_watches_them_instead_of_listing_again(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("slow"))
    gone = asyncio.get_running_loop().call_later(
        0.5, server.complete_pod_termination, "default", "slow"
    )

    try:
        result = await draining.drain_node(kube, "node-1", DrainOptions(timeout=5))
    finally:
        gone.cancel()

    assert names(result.evicted) == ["slow"]
    pod_reads = {kind.verb: n for kind, n in server.requests.items() if kind.resource == "pods"}
    assert pod_reads == {"LIST": 1, "WATCH": 1}


@pytest.mark.parametrize("kubelet_delay", [None])
async def test_pods_that_linger_past_the_deadline_time_the_drain_out(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("stuck"))

    with pytest.raises(errors.DrainTimedOut) as timed_out:
        await draining.drain_node(kube, "node-1", DrainOptions(timeout=60), clock=VirtualClock())

    assert timed_out.value.pods == ("default/stuck",)
    assert timed_out.value.pdb is None


@pytest.mark.parametrize("kubelet_delay", [None])
async def test_a_pod_replaced_under_the_same_name_counts_as_gone(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("sts-0"))

    async def controller() -> None:
        while not pods.is_terminating((await pods.on_node(kube, "node-1"))[0]):
            await asyncio.sleep(0.01)
        server.complete_pod_termination("default", "sts-0")
        server.seed(support.pod("sts-0"))  # a StatefulSet recreates it under its name

    replacing = asyncio.create_task(controller())
    result = await draining.drain_node(kube, "node-1", DrainOptions(timeout=5))
    await replacing

    assert names(result.evicted) == ["sts-0"]
    assert await remaining(kube) == ["sts-0"]


async def test_pod_deletion_mode_removes_only_gpu_pods_by_delete(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("train", resources=support.gpus(), labels={"app": "train"}))
    server.seed(support.pod("web"))
    server.seed(support.pdb("train-budget", {"app": "train"}, min_available=1))
    options = DrainOptions(pod_filter=pods.uses_gpu, use_eviction=False, grace_period_seconds=0)

    result = await draining.drain_node(kube, "node-1", options)

    assert names(result.evicted) == ["train"]
    assert [(s.pod.name, s.reason) for s in result.skipped] == [("web", SkipReason.FILTERED)]
    assert evictions(server) == []  # a delete does not consult budgets
    assert await remaining(kube) == ["web"]


async def test_the_pod_selector_narrows_what_is_considered(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("batch", labels={"kind": "batch"}))
    server.seed(support.pod("bare-service", owner=None, labels={"kind": "service"}))

    result = await draining.drain_node(kube, "node-1", DrainOptions(pod_selector="kind=batch"))

    assert names(result.evicted) == ["batch"]
    assert await remaining(kube) == ["bare-service"]


async def test_an_empty_node_drains_at_once(kube: client.Kube) -> None:
    result = await draining.drain_node(kube, "node-1")

    assert result.evicted == ()
    assert result.skipped == ()


def test_a_drain_without_a_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="deadline"):
        DrainOptions(timeout=0)


async def test_a_filter_built_from_the_listed_pods_narrows_the_removal_too(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("train", resources=support.gpus()))
    server.seed(support.pod("rdma", resources=support.gpus(1, "rdma/rdma_shared_device_a")))
    server.seed(support.pod("web"))
    seen: list[list[str]] = []

    async def gpu_window(listed):
        seen.append([pod["metadata"]["name"] for pod in listed])
        return await pods.holders_filter(kube, [Component.GPU], listed)

    options = DrainOptions(
        pod_filter=lambda pod: pod["metadata"]["name"] != "web",
        pod_filter_from=gpu_window,
        use_eviction=False,
        grace_period_seconds=0,
    )
    result = await draining.drain_node(kube, "node-1", options)

    assert seen == [["rdma", "train", "web"]]  # every pod the drain listed, once
    assert names(result.evicted) == ["train"]
    assert sorted(s.pod.name for s in result.skipped) == ["rdma", "web"]
    assert sorted(await remaining(kube)) == ["rdma", "web"]


async def counted_but_left(kube: client.Kube, name: str) -> None:
    """What a drain SIGKILLed mid-eviction leaves: the budget counts the eviction (its name
    in `disruptedPods`, `disruptionsAllowed` down) but the pod stays. The server counts
    before it deletes; an eviction whose delete precondition fails stops there too."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"},
        "deleteOptions": {"preconditions": {"uid": "not-this-pod"}},
    }
    with pytest.raises(errors.Conflict):
        await kube.call(kube.core.create_namespaced_pod_eviction, name, "default", eviction)


async def budget_status(kube: client.Kube, name: str) -> dict[str, object]:
    found = await kube.call(kube.policy.read_namespaced_pod_disruption_budget, name, "default")
    return dict(found.get("status") or {})


async def test_a_pod_whose_eviction_the_budget_already_counted_is_deleted_not_evicted_again(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("db-0", labels={"app": "db"}))
    server.seed(support.pod("db-1", node="node-2", labels={"app": "db"}))
    server.seed(support.pdb("db-budget", {"app": "db"}, min_available=1))
    await counted_but_left(kube, "db-0")
    status = await budget_status(kube, "db-budget")
    assert "db-0" in status["disruptedPods"] and status["disruptionsAllowed"] == 0  # type: ignore[operator]
    assert "db-0" in await remaining(kube)

    # the disruption controller would drop the entry two minutes on; the drain's 60 s
    # deadline runs on a virtual clock that passes at once while the budget refuses
    result = await draining.drain_node(
        kube, "node-1", DrainOptions(timeout=60), clock=VirtualClock()
    )

    assert names(result.evicted) == ["db-0"]
    assert await remaining(kube) == []
    assert evictions(server) == [("db-0", 409), ("db-0", 429)]  # never counted a second time
    deletes = [r for r in server.request_log if r.method == "DELETE" and r.path.endswith("/db-0")]
    assert [r.status for r in deletes] == [200]
    status = await budget_status(kube, "db-budget")
    assert status["disruptionsAllowed"] == 0  # db-1 is the one healthy pod minAvailable needs
    assert "db-1" in [pod["metadata"]["name"] for pod in await pods.on_node(kube, "node-2")]


async def test_a_budget_entry_older_than_the_pod_is_no_count_of_its_eviction(
    server: ApiServer, kube: client.Kube
) -> None:
    """A StatefulSet's pod takes the name of the one before it: an entry the earlier pod's
    eviction left (before the disruption controller saw it go) is not this pod's, so the
    drain waits for the budget as usual."""
    server.seed(support.pod("db-0", labels={"app": "db"}))
    server.seed(support.pod("db-1", node="node-2", labels={"app": "db"}))
    budget = support.pdb("db-budget", {"app": "db"}, min_available=1)
    earlier = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=30)
    budget["status"] = {"disruptedPods": {"db-0": earlier.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    server.seed(budget)
    status = await budget_status(kube, "db-budget")
    assert "db-0" in status["disruptedPods"] and status["disruptionsAllowed"] == 0  # type: ignore[operator]

    with pytest.raises(errors.DrainTimedOut) as timed_out:
        await draining.drain_node(kube, "node-1", DrainOptions(timeout=10), clock=VirtualClock())

    assert timed_out.value.pdbs == ("default/db-budget",)
    assert await remaining(kube) == ["db-0"]
    assert not [r for r in server.request_log if r.method == "DELETE"]
