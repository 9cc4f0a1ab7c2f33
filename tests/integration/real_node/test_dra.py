"""GPUs through DRA on the real node, with gpuop's processes as the chart runs them: the
device plugin's node agent (`gpuop run device-plugin --role node`, its `flags.kubeletRootDir`
the real kubelet's `--root-dir`) serves the DRA kubelet plugin, which the real kubelet
registers through its `plugins_registry`; the device plugin's cluster role (`--role
cluster`) writes the node's ResourceSlice from discovery's inventory and, once the real
scheduler allocated a ResourceClaim against it, tells the node the claim's allocation over
a real nats-server (`dra.ClaimAllocated`). The real kubelet prepares the claim, containerd
injects the claim's CDI devices, and the container lists exactly its GPU's device node; a
restart of the node agent while the pod runs loses no prepared claim, and the pod's deletion
makes the kubelet unprepare it at the restarted agent, which removes the claim's CDI spec."""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack

import pytest

from gpuop.bus import NatsServer
from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin.dra import cdispecs
from tests.integration.real_node.conftest import GPUS
from tests.support import dra_nodes
from tests.support.dra_nodes import RESOURCE
from tests.support.node_pods import pod, running
from tests.support.processes import DISCOVERY_CONFIG, service
from tests.support.real_node import RealNode
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_node, pytest.mark.nats]

WAIT = {"timeout": 120, "interval": 0.5}
CLAIM = "gpu-claim"
LISTING = "ls -l /dev | grep nvidia; echo done; "


async def test_the_real_kubelet_prepares_a_claim_the_cluster_role_told_the_node_of(
    node: RealNode, nats_server: NatsServer
) -> None:
    work = node.work / "dra-agents"
    work.mkdir(exist_ok=True)
    (work / "discovery.yaml").write_text(DISCOVERY_CONFIG, encoding="utf-8")
    config = dra_nodes.plugin_config(node, work / "device-plugin.yaml")
    on_node = ["--node", node.name, "--nats", nats_server.url, "--host-root", str(node.host_root)]
    on_node += ["--nvml", f"sim:{GPUS}", "--metrics-listen", "127.0.0.1:0"]
    plugin = ["device-plugin", "--role", "node", "--config", str(config), *on_node]
    cluster = ["device-plugin", "--role", "cluster", "--nats", nats_server.url]
    cluster += ["--kubeconfig", str(node.plane.admin_kubeconfig), "--metrics-listen", "127.0.0.1:0"]
    discovery = ["discovery", "--role", "node", "--config", str(work / "discovery.yaml"), *on_node]
    exit_codes: dict[str, int | None] = {}
    claims = f"{RESOURCE}/namespaces/default/resourceclaims"
    dra_nodes.serving_dra(node)
    with dra_nodes.kubelet_root_seen(node) as kubelet_root:
        node.plane.call("POST", f"{RESOURCE}/deviceclasses", dra_nodes.device_class())
        try:
            async with AsyncExitStack() as agents:
                for name, arguments in (("discovery", discovery), ("cluster", cluster)):
                    await agents.enter_async_context(
                        service(name, arguments, work / f"{name}.log", exit_codes)
                    )
                first = AsyncExitStack()
                logs = [work / "device-plugin-1.log", work / "device-plugin-2.log"]
                await first.enter_async_context(service("plugin-1", plugin, logs[0], exit_codes))
                await eventually(lambda: dra_nodes.registrations(logs[0]) > 0, **WAIT)
                published = await eventually(lambda: dra_nodes.slice_of(node), **WAIT)
                node.plane.call("POST", claims, dra_nodes.resource_claim(CLAIM))
                manifest = dra_nodes.with_claim(pod("dra", LISTING), CLAIM)
                async with running(node, manifest) as current:
                    log = current["log"]
                    uid = node.plane.call("GET", f"{claims}/{CLAIM}")["metadata"]["uid"]
                    (device,) = dra_nodes.allocated_devices(node, CLAIM)
                    (container,) = node.crictl("ps", "--name", "main", "--quiet").stdout.split()
                    inspected = json.loads(node.crictl("inspect", container).stdout)
                    spec = cdispecs.spec_path(HostRoot(node.host_root), uid)
                    assert spec.exists()
                    checkpoint = kubelet_root / "plugins/gpu.nvidia.com/checkpoint.json"
                    assert uid in checkpoint.read_text(encoding="utf-8")

                    # the node agent restarts while the pod runs: a new process, registered
                    # anew by the kubelet, that finds the claim prepared in its checkpoint
                    await first.aclose()
                    await agents.enter_async_context(
                        service("plugin-2", plugin, logs[1], exit_codes)
                    )
                    await eventually(lambda: dra_nodes.registrations(logs[1]) > 0, **WAIT)
                    assert spec.exists(), "the restart removed nothing"
                # the pod is gone: the kubelet unprepared the claim at the restarted agent
                await eventually(lambda: not spec.exists(), **WAIT)
                # the agent removes the spec, then the checkpoint's entry: a moment apart
                await eventually(lambda: uid not in checkpoint.read_text(encoding="utf-8"), **WAIT)
        finally:
            node.plane.request(f"{claims}/{CLAIM}", method="DELETE")
            node.plane.request(f"{RESOURCE}/deviceclasses/{dra_nodes.CLASS}", method="DELETE")

    assert exit_codes == dict.fromkeys(("plugin-1", "plugin-2", "cluster", "discovery"), 0)
    names = [d["name"] for d in published["spec"]["devices"]]
    assert names == [f"gpu-{minor}" for minor in range(GPUS)], names
    gpu_nodes = re.findall(r" (nvidia\d+)$", log, re.MULTILINE)
    assert gpu_nodes == [f"nvidia{device.removeprefix('gpu-')}"], log
    cdi_names = [d["name"] for d in inspected["info"]["config"]["CDI_devices"]]
    assert cdi_names == [f"k8s.gpu.nvidia.com/claim={uid}-{device}"], cdi_names
