"""Authentication, the kubeconfig, Status bodies and discovery."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as sync_client
from kubernetes import config as sync_config
from kubernetes.aio import client

from gpuop_sim import ApiServer, RequestKind
from tests.integration.sim.support import RawApi, pod


async def test_requests_without_the_bearer_token_get_401_status(raw: RawApi) -> None:
    status, body, headers = await raw.request("GET", "/api/v1/nodes", authenticated=False)

    assert status == 401
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


async def test_a_wrong_token_is_refused(server: ApiServer) -> None:
    async with RawApi(server.url, "not-the-token", server.ssl_context()) as wrong:
        status, _, _ = await wrong.request("GET", "/api/v1/namespaces")
    assert status == 401


def _read_kubeconfig(path: Path) -> tuple[dict[str, Any], int]:
    return yaml.safe_load(path.read_text()), path.stat().st_mode & 0o777


async def test_kubeconfig_names_server_token_and_context(server: ApiServer, kubeconfig: Path):
    written, mode = _read_kubeconfig(kubeconfig)

    assert mode == 0o600
    assert written["current-context"] == "gpuop-sim"
    assert written["clusters"][0]["cluster"]["server"] == server.url
    assert written["users"][0]["user"]["token"] == server.token
    assert server.url.startswith("https://127.0.0.1:")


async def test_sync_client_loads_the_kubeconfig(server: ApiServer, kubeconfig: Path) -> None:
    def list_namespaces() -> list[str]:
        api_client = sync_config.new_client_from_config(config_file=str(kubeconfig))
        with api_client:
            listed = sync_client.CoreV1Api(api_client).list_namespace()
            return [item.metadata.name for item in listed.items]

    names = await asyncio.to_thread(list_namespaces)

    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]


async def test_version_is_served_with_and_without_trailing_slash(
    raw: RawApi, api: client.ApiClient
) -> None:
    for path in ("/version", "/version/"):
        status, body, headers = await raw.request("GET", path)
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert body["major"] == "1"
    info = await client.VersionApi(api).get_code()
    assert info.git_version.startswith("v1.")


async def test_error_bodies_are_status_with_exact_json_content_type(raw: RawApi) -> None:
    status, body, headers = await raw.request("GET", "/api/v1/namespaces/default/pods/missing")

    assert status == 404
    assert headers["Content-Type"] == "application/json"
    assert body["kind"] == "Status"
    assert body["reason"] == "NotFound"
    assert body["message"] == 'pods "missing" not found'
    assert body["details"] == {"name": "missing", "kind": "pods"}


async def test_unknown_resources_are_404_status(raw: RawApi) -> None:
    status, body, _ = await raw.request("GET", "/apis/nothing.example/v1/things")
    assert status == 404
    assert body["reason"] == "NotFound"


async def test_discovery_lists_groups_resources_and_subresources(raw: RawApi) -> None:
    _, core_versions, _ = await raw.request("GET", "/api")
    _, groups, _ = await raw.request("GET", "/apis")
    _, core, _ = await raw.request("GET", "/api/v1")
    _, policy, _ = await raw.request("GET", "/apis/policy/v1")

    assert core_versions["versions"] == ["v1"]
    group_names = {group["name"] for group in groups["groups"]}
    assert {"policy", "coordination.k8s.io", "apps", "apiextensions.k8s.io"} <= group_names
    resources = {entry["name"]: entry for entry in core["resources"]}
    assert resources["pods"]["namespaced"] is True
    assert resources["nodes"]["namespaced"] is False
    assert resources["pods/status"]["verbs"] == ["get", "patch", "update"]
    assert resources["pods/eviction"]["kind"] == "Eviction"
    assert resources["pods/eviction"]["group"] == "policy"
    assert [entry["name"] for entry in policy["resources"]] == [
        "poddisruptionbudgets",
        "poddisruptionbudgets/status",
    ]


async def test_request_log_records_method_path_query_and_status(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.list_namespaced_pod("default", label_selector="app=x")

    record = server.request_log[-1]
    assert (record.method, record.path, record.status) == (
        "GET",
        "/api/v1/namespaces/default/pods",
        200,
    )
    assert "labelSelector=app%3Dx" in record.query


async def test_requests_are_counted_by_verb_resource_and_scope(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("p1"))
    await core.read_namespaced_pod("p1", "default")
    await core.list_namespaced_pod("default")
    await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1")
    await core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"a": "b"}}})
    eviction = {"metadata": {"name": "p1", "namespace": "default"}}
    await core.create_namespaced_pod_eviction("p1", "default", eviction)
    watch = await core.list_node_without_preload_content(watch=True, timeout_seconds=1)
    watch.close()
    await core.read_namespace("default")

    assert server.requests == {
        RequestKind("POST", "pods", "namespace"): 1,
        RequestKind("GET", "pods", "resource"): 1,
        RequestKind("LIST", "pods", "namespace"): 1,
        RequestKind("LIST", "pods", "cluster"): 1,
        RequestKind("PATCH", "pods", "resource"): 1,
        RequestKind("POST", "pods/eviction", "resource"): 1,
        RequestKind("WATCH", "nodes", "cluster"): 1,
        RequestKind("GET", "namespaces", "resource"): 1,
    }
