"""Helpers for the simulated API server suite: object builders and a raw HTTPS client."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import aiohttp

from gpuop import lifecycles
from gpuop_sim import ApiServer
from gpuop_sim.apiserver.resources import GroupResource

Obj = dict[str, Any]


def pod(
    name: str,
    *,
    node: str | None = "node-1",
    labels: dict[str, str] | None = None,
    namespace: str = "default",
) -> Obj:
    spec: Obj = {"containers": [{"name": "main", "image": "registry.example/app:1.0"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


def running(obj: Obj, *, ready: bool = True) -> Obj:
    """A pod as the kubelet reports it once started: Running, Ready or not."""
    obj = json.loads(json.dumps(obj))
    obj["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return obj


def node(name: str, *, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pdb(name: str, selector: dict[str, str], **budget: int | str) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": selector}, **budget},
    }


async def watch_opened(server: ApiServer, resource: GroupResource) -> None:
    """Wait until a watch of ``resource`` is registered, so later writes reach it."""
    while server.store.watch_count(resource) == 0:
        await asyncio.sleep(0.005)


class RawApi(lifecycles.Closable):
    """Raw HTTPS against the server, for what the official client hides; ``ssl_context``
    (``server.ssl_context()``) trusts the server's CA."""

    def __init__(self, url: str, token: str, ssl_context: ssl.SSLContext) -> None:
        self.url = url
        self.token = token
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context))

    async def close(self) -> None:
        await self.session.close()

    def _headers(self, content_type: str | None, authenticated: bool) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if authenticated else {}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = "application/json",
        params: dict[str, str] | None = None,
        authenticated: bool = True,
    ) -> tuple[int, Obj, aiohttp.typedefs.LooseHeaders]:
        data = None if body is None else json.dumps(body)
        async with self.session.request(
            method,
            self.url + path,
            data=data,
            params=params,
            headers=self._headers(content_type if data else None, authenticated),
        ) as response:
            return response.status, await response.json(content_type=None), response.headers

    async def watch(
        self, path: str, params: dict[str, str], *, count: int | None = None
    ) -> list[Obj]:
        """Read watch events until the stream ends (or ``count`` have arrived)."""
        events: list[Obj] = []
        async with self.session.get(
            self.url + path, params=params, headers=self._headers(None, True)
        ) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json"
            async for line in response.content:
                if line.strip():
                    events.append(json.loads(line))
                if count is not None and len(events) >= count:
                    break
        return events
