"""The contract suite's two API servers: every test here runs against `gpuop.sim`'s
`ApiServer` and against the real kube-apiserver (with kube-controller-manager: PDB status,
garbage collection and namespaces are its controllers' work), as the bus's contract suite
runs against both buses. What holds for one must hold for the other.

Each test works in a namespace of its own (created through the API on both servers) and on
cluster-scoped objects named after it, so one real control plane serves the whole session.
`Api.seed` makes an object with its status as a kubelet would have reported it: the sim
writes both at once, the real server takes the status through the status subresource.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes.aio import client, config

from gpuop_sim import ApiServer
from tests.support.control_plane import ControlPlane
from tests.support.waiting import eventually

Obj = dict[str, Any]


@pytest.fixture(scope="session")
def contract_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("contract-plane")
    with ControlPlane(work, kwok=False, scheduler=False) as plane:
        yield plane


def _ssl_from(kubeconfig: Path) -> ssl.SSLContext | None:
    cluster = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))["clusters"][0]["cluster"]
    data = cluster.get("certificate-authority-data")
    if not data:
        return None
    return ssl.create_default_context(cadata=base64.b64decode(data).decode())


@dataclass
class Api:
    """One test's view of one API server."""

    backend: str
    client: client.ApiClient
    namespace: str
    url: str
    token: str
    ssl: ssl.SSLContext | None
    session: aiohttp.ClientSession
    server: ApiServer | None
    plane: ControlPlane | None

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.client)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Obj]:
        """Plain HTTP as the admin, for what the official client hides; status and JSON."""
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = body if isinstance(body, str) else json.dumps(body)
            headers["Content-Type"] = content_type
        async with self.session.request(
            method, self.url + path, data=data, params=params, headers=headers, ssl=self.ssl
        ) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text.strip() else {})

    async def seed(self, obj: Obj) -> Obj:
        """Create `obj` in its namespace (this test's unless it names one) with its status."""
        obj = json.loads(json.dumps(obj))
        metadata = obj.setdefault("metadata", {})
        if obj["kind"] != "Node":
            metadata.setdefault("namespace", self.namespace)
        if self.server is not None:
            return self.server.seed(obj)
        status = obj.pop("status", None)
        path = _collection(obj)
        code, made = await self.request("POST", path, obj)
        assert code == 201, made
        if status is not None:  # a merge patch: controllers may have written the object since
            name = made["metadata"]["name"]
            code, made = await self.request(
                "PATCH", f"{path}/{name}/status", {"status": status},
                content_type="application/merge-patch+json",
            )  # fmt: skip
            assert code == 200, made
        return made

    async def watch(self, path: str, params: dict[str, str], count: int) -> list[Obj]:
        """The first `count` events of a watch of `path`."""
        events: list[Obj] = []
        headers = {"Authorization": f"Bearer {self.token}"}
        query = {**params, "watch": "true"}
        async with self.session.get(
            self.url + path, params=query, headers=headers, ssl=self.ssl
        ) as response:
            assert response.status == 200, await response.text()
            async for line in response.content:
                if line.strip():
                    events.append(json.loads(line))
                if len(events) >= count:
                    break
        return events


def config_map(name: str = "cm", **data: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def configmaps(api: Api) -> str:
    return f"/api/v1/namespaces/{api.namespace}/configmaps"


def pod(name: str, labels: dict[str, str] | None = None, node: str = "node-1") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.example/app:1.0"}],
        },
    }


def _collection(obj: Obj) -> str:
    group_version = obj["apiVersion"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    plural = {
        "Pod": "pods",
        "Node": "nodes",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "ConfigMap": "configmaps",
    }[obj["kind"]]
    namespace = obj["metadata"].get("namespace")
    scope = f"/namespaces/{namespace}" if obj["kind"] != "Node" else ""
    return f"{base}{scope}/{plural}"


@pytest.fixture(params=["sim", pytest.param("real", marks=pytest.mark.real_cluster)])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    namespace = f"contract-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as scratch:
        kubeconfig = Path(scratch) / "kubeconfig"
        server: ApiServer | None = None
        plane: ControlPlane | None = None
        if request.param == "sim":
            server = ApiServer(bookmark_interval=0.2, kubelet_delay=None)
            await server.start()
            server.write_kubeconfig(kubeconfig)
            url, token = server.url, server.token
        else:
            plane = request.getfixturevalue("contract_plane")
            plane.write_kubeconfig(kubeconfig)
            url, token = plane.url, plane.token
        configuration = client.Configuration()
        await config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        try:
            async with client.ApiClient(configuration) as api_client, aiohttp.ClientSession() as s:
                api = Api(
                    request.param, api_client, namespace, url, token, _ssl_from(kubeconfig),
                    s, server, plane,
                )  # fmt: skip
                await api.core.create_namespace({"metadata": {"name": namespace}})
                if plane is not None:
                    await _default_service_account(api)
                yield api
        finally:
            if server is not None:
                await server.stop()


async def _default_service_account(api: Api) -> None:
    """The ServiceAccount admission plugin refuses pods until the controller made it."""

    async def made() -> bool:
        accounts = await api.core.list_namespaced_service_account(api.namespace)
        return any(account.metadata.name == "default" for account in accounts.items)

    await eventually(made, 60, interval=0.1)
