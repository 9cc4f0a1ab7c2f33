"""The real node itself, as the real-node suites rely on it: the kubelet registers with the
real apiserver and the node becomes Ready at its own address; a plain pod (Debian's static
busybox, imported into containerd) is scheduled there, reaches Running, and its log, read
through the apiserver from the kubelet, shows what it printed, including the cluster DNS
answering a Service name through kube-proxy; no DNS query leaves the machine meanwhile."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import tiny_images
from tests.support.dns_capture import DnsCapture
from tests.support.real_node import CLUSTER_DNS, NODE_IP, POD_SUBNET, RealNode
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_node]

POD = "hello"
SCRIPT = (
    "echo hello from $(hostname); "
    "nslookup kubernetes.default.svc.cluster.local; "
    "echo nslookup exited $?; "
    "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"
)


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": tiny_images.BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", SCRIPT],
                }
            ],
        },
    }


def node_object(node: RealNode) -> dict[str, Any]:
    answer: dict[str, Any] = node.plane.call("GET", f"/api/v1/nodes/{node.name}")
    return answer


def test_the_node_registers_and_is_ready_at_its_own_address(node: RealNode) -> None:
    registered = node_object(node)
    addresses = {a["type"]: a["address"] for a in registered["status"]["addresses"]}
    ready = next(c for c in registered["status"]["conditions"] if c["type"] == "Ready")

    assert ready["status"] == "True"
    assert addresses["InternalIP"] == NODE_IP
    assert registered["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
    assert registered["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")


async def test_a_plain_pod_runs_and_its_log_shows_its_output(node: RealNode) -> None:
    path = "/api/v1/namespaces/default/pods"
    await eventually(lambda: _has_default_account(node), timeout=60, interval=0.5)
    node.plane.call("POST", path, pod(POD))
    try:

        def running() -> dict[str, Any] | None:
            current: dict[str, Any] = node.plane.call("GET", f"{path}/{POD}")
            if current["status"].get("phase") == "Running":
                return current
            return None

        current = await eventually(running, timeout=120, interval=0.5)
        assert current["spec"]["nodeName"] == node.name
        pod_ip = current["status"]["podIP"]
        assert pod_ip.startswith(POD_SUBNET.rsplit(".", 1)[0] + ".")

        def logged() -> str | None:
            status, body = node.plane.request(f"{path}/{POD}/log")
            text = body.decode(errors="replace")
            return text if status == 200 and "nslookup exited" in text else None

        log = await eventually(logged, timeout=60, interval=0.5)
        print(f"pod {POD} ({pod_ip}) log:\n{log}")
        assert f"hello from {POD}" in log
        assert CLUSTER_DNS in log  # the server that answered, through kube-proxy
        assert "10.96.0.1" in log  # the Service `kubernetes`, from the cluster DNS
        assert "nslookup exited 0" in log
    finally:
        node.plane.request(f"{path}/{POD}", method="DELETE", body={"gracePeriodSeconds": 0})
    await eventually(
        lambda: node.plane.request(f"{path}/{POD}")[0] == 404, timeout=60, interval=0.5
    )
    # the kubelet stopped the pod's sandbox (it removes stopped ones later, in its GC)
    ready = ("pods", "--name", POD, "--state", "ready", "--quiet")
    await eventually(lambda: node.crictl(*ready).stdout.strip() == "", timeout=60, interval=0.5)


def _has_default_account(node: RealNode) -> bool:
    status, _ = node.plane.request("/api/v1/namespaces/default/serviceaccounts/default")
    return status == 200


def test_no_dns_query_left_the_machine(node: RealNode, dns_capture: DnsCapture) -> None:
    """Last in the module: everything above ran with the capture on."""
    dns_capture.stop()  # each tcpdump writes out what it saw
    assert dns_capture.interfaces, "no outward interface to watch"
    assert dns_capture.packets() == [], json.dumps(dns_capture.packets(), indent=1)
