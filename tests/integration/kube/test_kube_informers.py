"""Informers: readers share one LIST and one WATCH, each sees every change, and a closed one
tells its readers."""

from __future__ import annotations

import asyncio

import pytest

from gpuop.kube import client, nodes
from gpuop.kube.informers import Informer
from gpuop.kube.watching import ListWatch
from gpuop_sim import ApiServer
from tests.support import kube_objects as support


def requests_to(server: ApiServer, path: str) -> list[str]:
    return [
        "WATCH" if "watch=" in record.query else record.method
        for record in server.request_log
        if record.path == path
    ]


async def test_readers_share_one_list_and_one_watch_and_each_sees_a_change(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))

    async with Informer(ListWatch(kube, kube.core.list_node)) as informer:
        listed = await asyncio.gather(informer.synced(), informer.synced())
        since = informer.version
        readers = [asyncio.ensure_future(informer.changed(since)) for _ in range(2)]
        await asyncio.sleep(0.1)  # both wait on the one watch
        await nodes.set_labels(kube, "node-1", {"state": "drain-required"})
        await asyncio.wait_for(asyncio.gather(*readers), 5)
        labels = nodes.labels_of(informer.objects[("", "node-1")])

    assert all(("", "node-1") in objects for objects in listed)
    assert labels == {"state": "drain-required"}
    assert requests_to(server, "/api/v1/nodes") == ["GET", "WATCH"]


async def test_a_closed_informer_fails_its_readers(server: ApiServer, kube: client.Kube) -> None:
    server.seed(support.node("node-1"))
    informer = Informer(ListWatch(kube, kube.core.list_node))
    await informer.synced()

    await informer.close()

    assert informer.failed
    with pytest.raises(RuntimeError, match="closed"):
        await informer.changed(informer.version)
