"""Pods on the real node (`tests.support.real_node`) for its suites: a pod of the imported
busybox image that prints what its script says and then waits, and `running`, which creates
it, waits for it to run and print `done`, and deletes it once the kubelet stopped it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tests.support import tiny_images
from tests.support.real_node import RealNode
from tests.support.waiting import eventually

PODS = "/api/v1/namespaces/default/pods"
WAIT = {"timeout": 120, "interval": 0.5}
FOREVER = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"


def pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
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
                    "command": ["sh", "-c", script + FOREVER],
                }
            ],
            **spec,
        },
    }


@asynccontextmanager
async def running(node: RealNode, manifest: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The pod created, until Running and its log says `done`; deleted after, until the
    kubelet has stopped its sandbox. Yields the pod with its log under `log`."""
    name = manifest["metadata"]["name"]
    await eventually(lambda: has_default_account(node), **WAIT)
    node.plane.call("POST", PODS, manifest)
    try:

        def started() -> dict[str, Any] | None:
            current: dict[str, Any] = node.plane.call("GET", f"{PODS}/{name}")
            return current if current["status"].get("phase") == "Running" else None

        def logged() -> str | None:
            status, body = node.plane.request(f"{PODS}/{name}/log")
            text = body.decode(errors="replace")
            return text if status == 200 and "done" in text.splitlines() else None

        current = await eventually(started, **WAIT)
        current["log"] = await eventually(logged, **WAIT)
        print(f"pod {name} ({current['status']['podIP']}) log:\n{current['log']}")
        yield current
    finally:
        node.plane.request(f"{PODS}/{name}", method="DELETE", body={"gracePeriodSeconds": 0})
    await eventually(lambda: node.plane.request(f"{PODS}/{name}")[0] == 404, **WAIT)
    # the kubelet stopped the pod's sandbox (it removes stopped ones later, in its GC)
    ready = ("pods", "--name", name, "--state", "ready", "--quiet")
    await eventually(lambda: node.crictl(*ready).stdout.strip() == "", **WAIT)


def has_default_account(node: RealNode) -> bool:
    status, _ = node.plane.request("/api/v1/namespaces/default/serviceaccounts/default")
    return status == 200
