"""The device quarantine end to end on the real node serving its two GPUs through DRA
(`node_rollouts.orchestrating(dra=True)`: the device plugin's node agent is the DRA kubelet
plugin the real kubelet calls, its cluster role writes the slice and tells the node the
claims' allocations, discovery, driver-manager, telemetry and the orchestrator run as
`gpuop run` processes).

Two pods each hold one GPU through a ResourceClaim the real scheduler allocated. An XID put
on GPU A in the real node's simulated NVML reaches telemetry, and the remediation
quarantines the device, not the node: a `NoSchedule` DeviceTaintRule for A's device, only
A's claim holder evicted (the kubelet stops it), reset, validation, the rule deleted at the
release. B's pod keeps running (same uid, same container, no restart). A pod whose claim is
made while A is quarantined is not allocated A, the only device free once A's holder is
gone: the scheduler allocates its claim only after the rule's deletion (the apiserver's
audit log orders the two), and then it runs on A.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import Buckets, NatsServer
from gpuop.events.remediation import RemediationState
from gpuop.kube import dra
from gpuop.saga.remediation.records import RemediationSaga
from gpuop.services.upgrade_orchestrator.remediations import REMEDIATION
from gpuop.services.upgrade_orchestrator.store import SagaStore
from gpuop_sim.nvml import sim_xids
from tests.integration.real_node.conftest import Cluster, started_cluster
from tests.support import dra_nodes, node_rollouts
from tests.support.control_plane import ControlPlane
from tests.support.dra_nodes import RESOURCE
from tests.support.node_workloads import (
    NAMESPACE,
    PODS,
    XID,
    phase,
    stopped_by_kubelet,
    workload,
)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_node, pytest.mark.nats]

GPUS = 2
WAIT = {"timeout": 180, "interval": 0.5}
REAL_NODE_LABEL = "gpuop.io/real-node"
CLAIMS = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
RULES = f"{RESOURCE}/devicetaintrules"
UPGRADE_POLICY: dict[str, Any] = {
    "podDeletion": {"force": True, "timeoutSeconds": 240},
    # the ladder's pod rung asks one nvidia.com/gpu, which a DRA node does not offer
    "validation": {"rungs": ["nvml", "cuda"]},
}
"""The workloads are bare pods (evicting them takes `force`)."""


def policy(source: Path, version: str) -> dict[str, Any]:
    """The real node in a driver pool of its own that serves DRA (what it serves already:
    no switch), the KWOK node left on the device plugin (no switch there either, which
    would hold a slot of the budget the remediation waits for)."""
    driver = node_rollouts.driver_spec(source, version)
    pool = {"name": "real", "nodeSelector": f"{REAL_NODE_LABEL}=true", "deviceAPI": "dra"}
    return {"driver": {**driver, "pools": [pool]}, "upgradePolicy": UPGRADE_POLICY}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The real node with 2 simulated GPUs and one KWOK GPU node."""
    with started_cluster(tmp_path_factory, gpus=GPUS, kwok_nodes=1) as started:
        yield started


def holder(name: str) -> dict[str, Any]:
    """A workload pod holding the ResourceClaim `<name>-gpu`."""
    return dra_nodes.with_claim(workload(name, 0), f"{name}-gpu")


def audited(plane: ControlPlane, resource: str, name: str, verb: str) -> list[dict[str, Any]]:
    """The apiserver's successful `verb` requests on `resource` `name` (a subresource after
    a slash), in order."""
    resource, _, subresource = resource.partition("/")
    return [
        event
        for event in plane.audit_events()
        if (ref := event.get("objectRef") or {}).get("resource") == resource
        and ref.get("name") == name
        and (ref.get("subresource") or "") == subresource
        and event["verb"] == verb
        and event["responseStatus"]["code"] < 300
    ]


def status_writes(plane: ControlPlane, claim: str) -> list[dict[str, Any]]:
    """Every successful write of the claim's status (the scheduler's allocation, the
    resourceclaim controller's deallocation)."""
    return [
        *audited(plane, "resourceclaims/status", claim, "update"),
        *audited(plane, "resourceclaims/status", claim, "patch"),
    ]


@pytest.mark.timeout(600)
async def test_an_xid_quarantines_one_dra_device_and_evicts_only_its_claims_holder(
    cluster: Cluster, nats_server: NatsServer, tmp_path: Path
) -> None:
    plane, node = cluster.plane, cluster.node
    plane.call("POST", f"{RESOURCE}/deviceclasses", dra_nodes.device_class())
    running = node_rollouts.driver_version(node)
    source = node_rollouts.driver_source(node, node.work / "driver-source", (running,))
    with node_rollouts.PodWatch(plane, tmp_path / "pods.json") as watch:
        async with node_rollouts.orchestrating(
            plane, node, cluster.kwok, nats_server, gpus=GPUS, kwok_version=running, dra=True
        ) as orchestrator:
            published = await eventually(lambda: dra_nodes.slice_of(node), **WAIT)
            uuids = {
                device["name"]: device["attributes"]["uuid"]["string"]
                for device in published["spec"]["devices"]
            }
            node_rollouts.apply_policy(plane, policy(source, running))
            for name in ("holder-a", "holder-b"):
                plane.call("POST", CLAIMS, dra_nodes.resource_claim(f"{name}-gpu"))
                plane.call("POST", PODS, holder(name))
            for name in ("holder-a", "holder-b"):
                await eventually(lambda name=name: phase(plane, name) == "Running", **WAIT)
            (device_a,) = dra_nodes.allocated_devices(node, "holder-a-gpu")
            (device_b,) = dra_nodes.allocated_devices(node, "holder-b-gpu")
            kept_before = plane.call("GET", f"{PODS}/holder-b")
            print(f"\nclaims: holder-a on {device_a}, holder-b on {device_b}")
            rule = dra.taint_rule_name(node.name, device_a)
            # an XID told before the orchestrator leads starts its remediation only at a resync
            log = node.work / "agents" / "orchestrator.log"
            await eventually(lambda: "leading as" in log.read_text(errors="replace"), **WAIT)
            store = SagaStore(await orchestrator.bus.kv(Buckets.SAGAS), REMEDIATION)

            async def quarantined() -> bool:
                if await store.get(node.name) is None:  # telemetry reads XIDs while watching
                    sim_xids.inject(node.host_root, uuids[device_a], XID)
                return plane.request(f"{RULES}/{rule}")[0] == 200

            await eventually(quarantined, timeout=180, interval=2.0)
            quarantine = plane.call("GET", f"{RULES}/{rule}")
            plane.call("POST", CLAIMS, dra_nodes.resource_claim("newcomer-gpu"))
            plane.call("POST", PODS, holder("newcomer"))

            async def remediated() -> RemediationSaga | None:
                stored = await store.get(node.name)
                ended = stored is not None and stored.saga.state in (
                    RemediationState.DONE,
                    RemediationState.FAILED,
                )
                return stored.saga if stored is not None and ended else None

            saga = await eventually(remediated, timeout=240, interval=2.0)
            assert saga.state is RemediationState.DONE, saga.failure
            walked = [f"{step.state} {step.step}: {step.detail}" for step in saga.history]
            print("the remediation's steps:\n  " + "\n  ".join(walked))
            await eventually(lambda: phase(plane, "newcomer") == "Running", **WAIT)
            newcomer = dra_nodes.allocated_devices(node, "newcomer-gpu")
            released = dra_nodes.allocated_devices(node, "holder-a-gpu")
            kept_after = plane.call("GET", f"{PODS}/holder-b")
            rules_left = plane.call("GET", RULES)["items"]
            node_after = plane.call("GET", f"/api/v1/nodes/{node.name}")
        stopped = stopped_by_kubelet(plane, watch, "holder-a")
        for name in ("holder-b", "newcomer"):
            plane.request(f"{PODS}/{name}", method="DELETE", body={"gracePeriodSeconds": 0})
        for name in ("holder-a", "holder-b", "newcomer"):
            plane.request(f"{CLAIMS}/{name}-gpu", method="DELETE")
        plane.request(f"{RESOURCE}/deviceclasses/{dra_nodes.CLASS}", method="DELETE")

    assert set(orchestrator.exit_codes.values()) == {0}, orchestrator.exit_codes
    print(f"the quarantine: {json.dumps(quarantine['spec'])}")
    assert quarantine["spec"]["taint"]["effect"] == "NoSchedule", quarantine
    assert json.dumps(quarantine["spec"]["deviceSelector"]).count(device_a) == 1, quarantine
    assert rules_left == [], rules_left
    # the node itself was never tainted nor cordoned: its other GPU kept serving
    taints = [t["key"] for t in node_after["spec"].get("taints") or []]
    assert not any(key.startswith("gpuop.io/") for key in taints), taints
    assert not node_after["spec"].get("unschedulable")
    assert stopped["exitCode"] == 0, stopped
    assert kept_after["metadata"]["uid"] == kept_before["metadata"]["uid"]
    (before,) = kept_before["status"]["containerStatuses"]
    (after,) = kept_after["status"]["containerStatuses"]
    assert kept_after["status"]["phase"] == "Running" and after["restartCount"] == 0
    assert after["containerID"] == before["containerID"]
    # A was free once its holder's claim was deallocated (the resourceclaim controller's
    # last status write of it), before the rule's deletion; the newcomer got A, the only
    # device left, but only once the rule was deleted
    assert released == [], released
    assert newcomer == [device_a], newcomer
    (deleted,) = audited(plane, "devicetaintrules", rule, "delete")
    freed = max(write["stageTimestamp"] for write in status_writes(plane, "holder-a-gpu"))
    allocations = [write["stageTimestamp"] for write in status_writes(plane, "newcomer-gpu")]
    print(f"holder-a-gpu deallocated {freed}; rule deleted {deleted['stageTimestamp']}; "
          f"newcomer-gpu's status writes: {allocations}")  # fmt: skip
    assert freed < deleted["stageTimestamp"] < min(allocations), allocations
