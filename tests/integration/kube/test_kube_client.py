"""Connecting through a kubeconfig, and the mapping of every failure to `gpuop.kube.errors`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.kube import client, errors, nodes
from gpuop_sim import ApiServer
from tests.support import kube_objects as support


async def test_connects_through_the_kubeconfig_and_reads_objects_as_wire_dicts(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1", labels={"nvidia.com/gpu.present": "true"}))

    node = await nodes.get(kube, "node-1")

    assert node["kind"] == "Node"
    assert node["metadata"]["labels"] == {"nvidia.com/gpu.present": "true"}
    assert node["metadata"]["resourceVersion"].isdigit()
    assert server.request_log[-1].path == "/api/v1/nodes/node-1"


async def test_a_missing_object_is_not_found_with_the_status_body(kube: client.Kube) -> None:
    with pytest.raises(errors.NotFound) as raised:
        await nodes.get(kube, "nowhere")

    assert raised.value.code == 404
    assert raised.value.reason == "NotFound"
    assert raised.value.message == 'nodes "nowhere" not found'
    assert raised.value.status["kind"] == "Status"
    assert not raised.value.temporary


async def test_creating_an_existing_name_is_already_exists_a_kind_of_conflict(
    kube: client.Kube,
) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}

    with pytest.raises(errors.AlreadyExists) as raised:
        await kube.call(kube.core.create_namespace, body)

    assert isinstance(raised.value, errors.Conflict)
    assert raised.value.code == 409


async def test_a_body_the_client_models_refuse_is_invalid_before_sending(
    server: ApiServer, kube: client.Kube
) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    requests = len(server.request_log)

    with pytest.raises(errors.Invalid, match="client refused") as raised:
        await kube.call(kube.core.create_namespaced_pod, "default", body)

    assert raised.value.code is None
    assert len(server.request_log) == requests


async def test_an_object_the_server_refuses_is_invalid(kube: client.Kube) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "bad"},
        "spec": {"leaseDurationSeconds": 0},
    }

    with pytest.raises(errors.Invalid) as raised:
        await kube.call(kube.coordination.create_namespaced_lease, "default", lease)

    assert raised.value.code == 422
    assert "leaseDurationSeconds" in raised.value.message


async def test_a_stopped_server_is_unreachable_and_temporary(tmp_path: Path) -> None:
    async with ApiServer() as stopped:
        kubeconfig = stopped.write_kubeconfig(tmp_path / "kubeconfig")

    async with await client.connect(kubeconfig, request_timeout=2) as kube:
        with pytest.raises(errors.Unreachable) as raised:
            await nodes.get(kube, "node-1")

    assert raised.value.temporary


async def test_a_wrong_token_is_unauthorized(server: ApiServer, tmp_path: Path) -> None:
    server.token, real = "wrong", server.token
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    server.token = real

    async with await client.connect(kubeconfig) as kube:
        with pytest.raises(errors.Unauthorized):
            await nodes.get(kube, "node-1")


async def test_a_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="missing"):
        await client.connect(tmp_path / "missing")


async def test_no_kubeconfig_outside_a_cluster_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    with pytest.raises(errors.ConfigError, match="in-cluster"):
        await client.connect(None)


def test_errors_map_status_codes_and_retry_hints() -> None:
    throttled = errors.from_response(
        429,
        b'{"kind":"Status","reason":"TooManyRequests","message":"slow down","code":429}',
        {"Retry-After": "3"},
    )
    expired = errors.from_status(410, {"reason": "Expired", "message": "too old"})
    broken = errors.from_response(502, b"<html>bad gateway</html>", {})

    assert isinstance(throttled, errors.TooManyRequests)
    assert throttled.retry_after == 3.0
    assert throttled.temporary
    assert isinstance(expired, errors.Expired)
    assert isinstance(broken, errors.ServerError)
    assert broken.message == "<html>bad gateway</html>"
    assert broken.temporary
