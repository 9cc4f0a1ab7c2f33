"""Ways to run the server: in a thread for synchronous clients, and the CLI entry point."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from kubernetes import client as sync_client
from kubernetes import config as sync_config
from kubernetes import watch as sync_watch
from kubernetes.aio import client, config

from gpuop_sim import ApiServer, ThreadedApiServer
from gpuop_sim.cluster.cli import run_apiserver
from tests.integration.sim.support import node, pod, running


def test_threaded_server_serves_synchronous_clients(tmp_path: Path) -> None:
    with ThreadedApiServer(kubelet_delay=None) as server:
        path = server.write_kubeconfig(tmp_path / "kubeconfig")
        server.seed(running(pod("a")))
        with sync_config.new_client_from_config(config_file=str(path)) as api_client:
            core = sync_client.CoreV1Api(api_client)
            core.create_node(node("node-1"))
            names = [n.metadata.name for n in core.list_node().items]
            stream = sync_watch.Watch()
            events = [
                event["type"]
                for event in stream.stream(core.list_namespaced_pod, "default", timeout_seconds=1)
            ]
            core.delete_namespaced_pod("a", "default")
            terminating = core.read_namespaced_pod("a", "default").metadata.deletion_timestamp

    assert names == ["node-1"]
    assert events == ["ADDED"]
    assert terminating is not None


async def test_run_apiserver_writes_kubeconfig_seeds_and_serves_until_cancelled(
    tmp_path: Path,
) -> None:
    manifests = tmp_path / "cluster.yaml"
    manifests.write_text(yaml.safe_dump_all([node("node-1"), node("node-2")]))
    kubeconfig = tmp_path / "kubeconfig"
    ready: asyncio.Future[ApiServer] = asyncio.get_running_loop().create_future()

    serving = asyncio.create_task(
        run_apiserver(kubeconfig, manifests=[manifests], on_ready=ready.set_result)
    )
    await ready
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        nodes = await client.CoreV1Api(api).list_node()
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving

    assert [n.metadata.name for n in nodes.items] == ["node-1", "node-2"]
