"""network-manager end to end, as `gpuop run network-manager` runs it: the cluster role on
the simulated API server and two node roles in their own network namespaces, each with its
own connection to a real nats-server. A policy in Kubernetes becomes attachments in
Kubernetes and links on the nodes; taking the network out of the policy takes both away."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from gpuop.bus import NatsServer
from gpuop.kube import client, customobjects
from gpuop.policy import crd, specs
from gpuop.runtime.services import ServiceContext
from gpuop.runtime.settings import Role
from gpuop.services import network_manager
from gpuop_sim import ApiServer
from gpuop_sim.apiserver.crds import network_attachment_definitions
from tests.support.networks import wire
from tests.support.services import in_process
from tests.support.waiting import eventually

from .conftest import SimNode, addresses_of

pytestmark = pytest.mark.nats

POOL = {"cidr": "192.168.100.0/24", "rangeStart": "192.168.100.10", "rangeEnd": "192.168.100.20"}


def service(
    nats: NatsServer,
    tmp_path: Path,
    config_text: str = "retry_interval_seconds: 0.1\n",
    **settings: Any,
) -> AbstractAsyncContextManager[ServiceContext]:
    """network-manager in this process with its own bus and `config_text` as its `--config`."""
    config = tmp_path / f"{settings.get('node') or 'cluster'}.yaml"
    config.write_text(config_text)
    return in_process(network_manager.SERVICE, nats, config=config, **settings)


async def test_a_policy_becomes_attachments_and_links_and_goes_away_again(
    make_node: Callable[[str], SimNode], nats_server: NatsServer, tmp_path: Path
) -> None:
    nodes = [make_node("gpu-node-1"), make_node("gpu-node-2")]
    async with ApiServer(bookmark_interval=0.2) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        async with await client.connect(kubeconfig) as kube:
            extensions = k8s.ApiextensionsV1Api(kube.api_client)
            for definition in (crd.build(), network_attachment_definitions()):
                await kube.call(extensions.create_custom_resource_definition, definition)
            policy = {
                "apiVersion": specs.API_VERSION,
                "kind": specs.KIND,
                "metadata": {"name": "default"},
                "spec": {
                    "driver": {"gpu": {"version": "580.105.08"}},
                    "network": {"networks": [wire(mtu=9000, ipam=POOL)]},
                },
            }
            await customobjects.create(kube, customobjects.GPU_CLUSTER_POLICIES, policy)

            async with (
                service(nats_server, tmp_path, role=Role.CLUSTER, kubeconfig=kubeconfig),
                service(
                    nats_server,
                    tmp_path,
                    role=Role.NODE,
                    node=nodes[0].name,
                    host_root=nodes[0].root.path,
                    config_text=f"netns: {nodes[0].netns}\nretry_interval_seconds: 0.1\n",
                ) as first,
                service(
                    nats_server,
                    tmp_path,
                    role=Role.NODE,
                    node=nodes[1].name,
                    host_root=nodes[1].root.path,
                    config_text=f"netns: {nodes[1].netns}\nretry_interval_seconds: 0.1\n",
                ),
            ):

                async def linked() -> bool:
                    return all(addresses_of(node.link("gpuop-roce-a") or {}) for node in nodes)

                await eventually(linked, timeout=20.0)
                nads = await customobjects.list_objects(
                    kube, customobjects.NETWORK_ATTACHMENT_DEFINITIONS
                )
                assert [item["metadata"]["name"] for item in nads] == ["roce-a"]
                held = [addresses_of(node.link("gpuop-roce-a") or {})[0] for node in nodes]
                assert len(set(held)) == 2
                assert first.ready

                await kube.call(
                    kube.custom_objects.patch_cluster_custom_object,
                    specs.GROUP,
                    specs.VERSION,
                    specs.PLURAL,
                    "default",
                    {"spec": {"network": {"networks": []}}},
                    _content_type="application/merge-patch+json",
                )

                async def gone() -> bool:
                    listed = await customobjects.list_objects(
                        kube, customobjects.NETWORK_ATTACHMENT_DEFINITIONS
                    )
                    return not listed and all(node.link("gpuop-roce-a") is None for node in nodes)

                await eventually(gone, timeout=20.0)
