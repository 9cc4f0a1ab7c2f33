"""The real control plane itself, as the other real-cluster suites rely on it: the version
it was built at, KWOK GPU nodes kept Ready by their leases, GPU pods placed by the real
scheduler (and refused where no node has the GPUs), and an audit log that names who asked."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kubernetes.aio import client

from tests.support import control_plane
from tests.support.control_plane import ControlPlane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_cluster]

VERSIONS = Path(control_plane.REPO / "tests" / "cluster" / "versions.env")


def pinned_kubernetes() -> str:
    for line in VERSIONS.read_text(encoding="utf-8").splitlines():
        if line.startswith("KUBERNETES="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"no KUBERNETES= line in {VERSIONS}")


async def test_the_apiserver_reports_the_pinned_release(api: client.ApiClient) -> None:
    version = await client.VersionApi(api).get_code()
    major, minor, _ = pinned_kubernetes().split(".")

    assert version.git_version == f"v{pinned_kubernetes()}"
    assert (version.major, version.minor) == (major, minor)


async def test_kwok_keeps_gpu_nodes_ready_with_their_leases(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    nodes = (await core.list_node()).items
    leases = client.CoordinationV1Api(api)

    assert len(nodes) == 3
    for node in nodes:
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True"
        lease = await leases.read_namespaced_lease(node.metadata.name, "kube-node-lease")
        assert lease.spec.lease_duration_seconds == 40  # KWOK's, renewed by KWOK
        assert lease.spec.renew_time is not None


def gpu_pod(name: str, gpus: int) -> dict[str, object]:
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/cuda:12",
                    "resources": {"limits": limits},
                }
            ]
        },
    }


async def test_the_scheduler_places_gpu_pods_and_refuses_what_fits_nowhere(
    api: client.ApiClient,
) -> None:
    core = client.CoreV1Api(api)
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": namespace}})

    async def service_account() -> bool:
        accounts = await core.list_namespaced_service_account(namespace)
        return any(a.metadata.name == "default" for a in accounts.items)

    await eventually(service_account, 60)
    await core.create_namespaced_pod(namespace, gpu_pod("fits", 1))
    await core.create_namespaced_pod(namespace, gpu_pod("too-big", 9))

    async def running() -> bool:
        pod = await core.read_namespaced_pod("fits", namespace)
        return pod.status.phase == "Running" and bool(pod.spec.node_name)

    async def refused() -> bool:
        pod = await core.read_namespaced_pod("too-big", namespace)
        conditions = pod.status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    await eventually(running, 60)
    await eventually(refused, 60)
    pod = await core.read_namespaced_pod("too-big", namespace)
    scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert "Insufficient nvidia.com/gpu" in scheduled.message
    assert pod.spec.node_name is None


async def test_the_audit_log_names_the_user_and_verb_of_each_request(
    plane: ControlPlane, api: client.ApiClient
) -> None:
    name = f"audited-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespaced_config_map(
        "default", {"metadata": {"name": name}, "data": {"k": "v"}}
    )

    def found() -> list[dict[str, object]]:
        return [
            event
            for event in plane.audit_events()
            if (event.get("objectRef") or {}).get("name") == name
        ]

    async def logged() -> bool:
        return bool(found())

    await eventually(logged, 30)
    event = found()[0]
    assert event["verb"] == "create"
    assert event["user"]["username"] == control_plane.ADMIN  # type: ignore[index]
    assert event["responseStatus"]["code"] == 201  # type: ignore[index]
