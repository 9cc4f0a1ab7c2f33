"""The real node itself, as the real-node suites rely on it: the kubelet registers with the
real apiserver and the node becomes Ready at its own address; a plain pod (Debian's static
busybox, imported into containerd) is scheduled there, reaches Running, and its log, read
through the apiserver from the kubelet, shows what it printed, including the cluster DNS
answering a Service name through kube-proxy and refusing any other; a pod of the RuntimeClass
`nvidia` runs on the handler gpuop's own containerd drop-in adds; a pull goes nowhere; and no
DNS query leaves the machine meanwhile."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import pytest

from tests.integration.real_node.conftest import GPUS
from tests.support import real_node
from tests.support.dns_capture import DnsCapture
from tests.support.node_pods import pod, running
from tests.support.real_node import (
    CLUSTER_DNS,
    CLUSTER_DOMAIN,
    NO_REGISTRY,
    NODE_IP,
    POD_SUBNET,
    RealNode,
)

pytestmark = [pytest.mark.real_node]

DNS_SCRIPT = (
    "echo hello from $(hostname); "
    "nslookup kubernetes.default.svc.cluster.local; "
    "echo nslookup exited $?; "
    "nslookup example.com; "
    "echo done; "
)


def test_the_node_registers_and_is_ready_at_its_own_address(node: RealNode) -> None:
    registered: dict[str, Any] = node.plane.call("GET", f"/api/v1/nodes/{node.name}")
    addresses = {a["type"]: a["address"] for a in registered["status"]["addresses"]}
    ready = next(c for c in registered["status"]["conditions"] if c["type"] == "Ready")
    info = registered["status"]["nodeInfo"]

    assert ready["status"] == "True"
    assert addresses["InternalIP"] == NODE_IP
    assert info["kubeletVersion"].startswith("v1.")
    assert info["containerRuntimeVersion"].startswith("containerd://2.")


async def test_a_plain_pod_runs_and_its_log_shows_its_output(node: RealNode) -> None:
    async with running(node, pod("hello", DNS_SCRIPT)) as current:
        log = current["log"]

    assert current["spec"]["nodeName"] == node.name
    assert current["status"]["podIP"].startswith(POD_SUBNET.rsplit(".", 1)[0] + ".")
    assert "hello from hello" in log
    assert CLUSTER_DNS in log  # the server that answered, through kube-proxy
    assert "10.96.0.1" in log  # the Service `kubernetes`, from the cluster DNS
    assert "nslookup exited 0" in log
    assert "can't find example.com: REFUSED" in log  # the cluster domain only


async def test_a_pod_of_runtime_class_nvidia_runs_on_gpuops_drop_in_handler(
    node: RealNode,
) -> None:
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    node.plane.call("POST", "/apis/node.k8s.io/v1/runtimeclasses", runtime_class)
    drop_in = node.containerd_config.parent / "conf.d" / "99-nvidia.toml"
    try:
        async with running(node, pod("handled", "echo done; ", runtimeClassName="nvidia")):
            (sandbox,) = node.crictl("pods", "--name", "handled", "--quiet").stdout.split()
            inspected = json.loads(node.crictl("inspectp", sandbox).stdout)
    finally:
        node.plane.request("/apis/node.k8s.io/v1/runtimeclasses/nvidia", method="DELETE")

    assert inspected["status"]["runtimeHandler"] == "nvidia"
    assert "runtimes.nvidia" in drop_in.read_text()  # the handler is gpuop's, not ours


def test_the_host_root_is_a_gpu_nodes_with_real_device_nodes(node: RealNode) -> None:
    devices = node.host_root / "dev"
    made = {path.name: path.stat() for path in devices.iterdir()}

    assert set(made) == set(real_node.device_nodes(GPUS))
    assert set(real_node.device_nodes(GPUS)) >= {"nvidia0", "nvidia7", "nvidiactl", "nvidia-uvm"}
    for name, (major, minor) in real_node.device_nodes(GPUS).items():
        assert stat.S_ISCHR(made[name].st_mode), name
        assert (os.major(made[name].st_rdev), os.minor(made[name].st_rdev)) == (major, minor)
    assert (node.host_root / "proc" / "driver" / "nvidia" / "version").is_file()


def test_an_image_pull_goes_nowhere(node: RealNode) -> None:
    """Every registry is NO_REGISTRY: a pull is refused on loopback, nothing is looked up
    (the capture below would see the query)."""
    answer = node.crictl("pull", "registry.k8s.io/pause:3.10", check=False)

    assert answer.returncode != 0
    assert NO_REGISTRY.removeprefix("http://") in answer.stderr


def test_no_dns_query_left_the_machine(node: RealNode, dns_capture: DnsCapture) -> None:
    """Last in the module: everything above ran with the capture on. The machine may be
    shared (CI runs this stage alone; a developer's machine does other work), so a query
    fails the test when it names something this suite could have asked: the cluster's
    domain, the node, the images and registries, the names its pods look up."""
    dns_capture.stop()  # each tcpdump writes out what it saw
    ours = [name for name in dns_capture.queries() if _asked_here(name, node)]

    assert dns_capture.interfaces, "no outward interface to watch"
    assert ours == [], json.dumps(dns_capture.packets(), indent=1)


def _asked_here(name: str, node: RealNode) -> bool:
    name = name.lower().rstrip(".")
    mine = (CLUSTER_DOMAIN, "invalid", node.name, "example.com", "registry.k8s.io", "kubernetes")
    return any(name == m or name.endswith("." + m) or name.startswith(m + ".") for m in mine)


def test_a_suite_query_would_be_told_from_other_traffic(node: RealNode) -> None:
    assert _asked_here("kubernetes.default.svc.cluster.local", node)
    assert _asked_here("gpuop.invalid", node)
    assert _asked_here(node.name, node)
    assert not _asked_here("pypi.org", node)
