"""README's flow for people, as written: `make cluster` (its launcher,
`python -m tests.support.cluster`, which the target runs, here without a terminal) starts the
control plane with the real node and KWOK beside it, installs the chart and prints the
kubeconfig, the image and how to stop it; `kubectl get pods -A` shows gpuop's pods Ready on
the real node; `gpuop demo --headless --kubeconfig <it>` rolls a small fleet of its own to the
end on that cluster, setting the installed gpuop aside meanwhile and putting it back; then
the installed gpuop serves DRA once the policy says `deviceAPI: dra` for a pool of the real
node alone: the `device-api` saga switches it (its Event `device-api-done`), the device
plugin's cluster role publishes its ResourceSlice, and a pod whose ResourceClaimTemplate asks
one `gpu.nvidia.com` device runs there and sees its GPU's device node (the chart's
`nodeAgents.kubeletRootDir` the real kubelet's root); Ctrl-C (SIGINT) stops the launcher and
everything it started."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuop.events import dra
from gpuop.events.device_api import DeviceApiState
from gpuop.policy import specs
from gpuop.saga.device_api.drafting import EVENT_REASON
from gpuop_sim.cluster.installed import SKIP_LABEL
from tests.support import node_pods, real_node, tiny_images
from tests.support.control_plane import BIN, REPO
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_node, pytest.mark.timeout(1200)]

DEMO_NODES = 2
DRA_WAIT = {"timeout": 240, "interval": 1.0}
"""The switch (cordon, drain, the plugin's swap, the slice, the validation pod, uncordon)
and the claim's pod, on a loaded two-core machine."""
REAL_NODE_LABEL = "gpuop.io/real-node"
LISTING = "ls /dev | grep nvidia; echo done; "


class Launcher:
    """The launcher's process and its output, line by line."""

    def __init__(self) -> None:
        # its own work directory, as `make cluster` (a short path: containerd's sockets)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.cluster", "--nodes", "1"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, prefix: str, timeout: float) -> str:
        while True:
            line = self.lines.get(timeout=timeout)
            assert line is not None, "the launcher ended:\n" + "\n".join(self.seen[-60:])
            self.seen.append(line)
            if line.startswith(prefix):
                return line


def kubectl(
    kubeconfig: str, *arguments: str, given: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl as the admin; `given` is its standard input (for `-f -`), as JSON."""
    return subprocess.run(
        [str(BIN / "kubectl"), "--kubeconfig", kubeconfig, *arguments],
        input=None if given is None else json.dumps(given),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def applied(kubeconfig: str, manifest: dict[str, Any]) -> None:
    done = kubectl(kubeconfig, "apply", "-f", "-", given=manifest)
    assert done.returncode == 0, done.stderr


def dra_policy(version: str) -> dict[str, Any]:
    """The real node in a driver pool of its own that serves DRA, its driver the one it runs
    (no upgrade); the rollout kept to the real node, so no KWOK node (no agents there) gets
    a saga; the validation pod the node's own busybox (nothing is pulled)."""
    real = f"{REAL_NODE_LABEL}=true"
    pool = {"name": "real", "nodeSelector": real, "deviceAPI": "dra"}
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": version}, "pools": [pool]},
            "upgradePolicy": {
                "nodeSelector": real,
                "validation": {
                    "pod": {"image": tiny_images.BUSYBOX, "command": ["sh", "-c", LISTING]}
                },
            },
        },
    }


def claiming_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    """A ResourceClaimTemplate for one whole GPU (NVIDIA's DeviceClass, the chart's) and a
    pod on the real node whose claim is made from it, listing its GPU device nodes."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": dra.DRIVER}}
            ]}}
        },
    }  # fmt: skip
    manifest = node_pods.pod(
        "dra-claim", LISTING, nodeSelector={REAL_NODE_LABEL: "true"},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    )  # fmt: skip
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return template, manifest


async def serves_dra(kubeconfig: str, work: Path) -> None:
    """The policy puts the real node on DRA: the switch is done, the slice is there, and a
    pod with a claim runs on the node and sees one GPU."""
    started = time.monotonic()
    version = (work / "real-node/host/sys/module/nvidia/version").read_text().strip()
    applied(kubeconfig, dra_policy(version))

    def switched() -> list[str] | None:
        listed = kubectl(
            kubeconfig, "get", "events", "-n", "default", "-o", "json", "--field-selector",
            f"involvedObject.name={real_node.NAME},reason={EVENT_REASON}",
        )  # fmt: skip
        said = [e["message"] for e in json.loads(listed.stdout or '{"items": []}')["items"]]
        failed = [m for m in said if DeviceApiState.FAILED in m]
        assert not failed, said
        return said if any(DeviceApiState.DONE in m for m in said) else None

    said = await eventually(switched, **DRA_WAIT)
    print("\n".join(said))

    def published() -> list[str] | None:
        listed = json.loads(kubectl(kubeconfig, "get", "resourceslices", "-o", "json").stdout)
        ours = [
            d["name"] for s in listed["items"]
            if s["spec"].get("nodeName") == real_node.NAME and s["spec"]["driver"] == dra.DRIVER
            for d in s["spec"].get("devices") or []
        ]  # fmt: skip
        return ours or None

    devices = await eventually(published, **DRA_WAIT)
    assert devices == [f"gpu-{minor}" for minor in range(len(devices))], devices

    template, manifest = claiming_pod()
    applied(kubeconfig, template)
    applied(kubeconfig, manifest)

    def logged() -> str | None:
        done = kubectl(kubeconfig, "logs", "-n", "default", "dra-claim")
        return done.stdout if "done" in done.stdout.splitlines() else None

    log = await eventually(logged, **DRA_WAIT)
    shown = kubectl(kubeconfig, "get", "pod", "-n", "default", "dra-claim", "-o", "json")
    pod = json.loads(shown.stdout)
    assert pod["spec"]["nodeName"] == real_node.NAME
    (claim,) = pod["status"]["resourceClaimStatuses"]
    allocated = json.loads(
        kubectl(kubeconfig, "get", "resourceclaim", "-n", "default", claim["resourceClaimName"],
                "-o", "json").stdout
    )  # fmt: skip
    (result,) = allocated["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == dra.DRIVER
    print(f"DRA served {time.monotonic() - started:.0f} s after the policy")
    assert re.findall(r"^(nvidia\d+)$", log, re.MULTILINE) == [
        f"nvidia{result['device'].removeprefix('gpu-')}"
    ], log


def test_make_cluster_then_the_demo_then_dra_on_it() -> None:
    absent = real_node.missing()
    if absent:
        pytest.fail("the real node needs: " + ", ".join(absent))
    launcher = Launcher()
    work: Path | None = None
    try:
        exported = launcher.until("export KUBECONFIG=", timeout=900)
        kubeconfig = exported.removeprefix("export KUBECONFIG=")
        work = Path(kubeconfig).parents[1]  # <work>/control-plane/admin.kubeconfig
        print("\n".join(launcher.seen))
        assert any(line.startswith("image: gpuop.local/gpuop-sim:") for line in launcher.seen)
        logs = launcher.until("logs in", timeout=10)
        assert logs.endswith("; Ctrl-C stops it")

        listed = kubectl(kubeconfig, "get", "pods", "-A", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        gpuop_pods = [
            p for p in json.loads(listed.stdout)["items"]
            if p["metadata"]["namespace"] == "gpuop-system"
            and p["spec"]["nodeName"] == real_node.NAME
        ]  # fmt: skip
        assert len(gpuop_pods) >= 10
        for pod in gpuop_pods:
            ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
            assert ready.get("Ready") == "True", pod["metadata"]["name"]
        print(kubectl(kubeconfig, "get", "pods", "-A").stdout)

        demo = subprocess.run(
            [str(Path(sys.executable).parent / "gpuop"), "demo", "--headless",
             "--kubeconfig", kubeconfig, "--nodes", str(DEMO_NODES), "--gpus", "2"],
            capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        print(demo.stdout[-4000:], demo.stderr[-4000:])
        assert demo.returncode == 0, demo.stderr[-3000:]
        outcome = json.loads(demo.stdout.strip().splitlines()[-1])
        assert (outcome["nodes"], outcome["done"], outcome["failed"]) == (DEMO_NODES, DEMO_NODES, 0)
        said = [line for line in demo.stdout.splitlines() if line.startswith("gpuop demo: ")]
        assert len(said) == 2, said  # the cluster roles paused, the nodes already here skipped
        assert "gpuop-system/gpuop-upgrade-orchestrator" in said[0]
        assert real_node.NAME in said[1]

        # the installed gpuop is back as it was
        orchestrator = kubectl(
            kubeconfig, "get", "deployment", "-n", "gpuop-system", "gpuop-upgrade-orchestrator",
            "-o", "jsonpath={.spec.replicas}",
        )  # fmt: skip
        assert orchestrator.stdout == "2"
        node = json.loads(kubectl(kubeconfig, "get", "node", real_node.NAME, "-o", "json").stdout)
        assert SKIP_LABEL not in node["metadata"]["labels"]
        assert logs == f"logs in {work}; Ctrl-C stops it"

        asyncio.run(serves_dra(kubeconfig, work))
    finally:
        os.killpg(launcher.process.pid, signal.SIGINT)  # Ctrl-C
        code = launcher.process.wait(timeout=300)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    launcher.until("stopped", timeout=10)
    assert code == 0
