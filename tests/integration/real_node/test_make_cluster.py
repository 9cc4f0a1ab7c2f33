"""README's flow for people, as written: `make cluster` (its launcher,
`python -m tests.support.cluster`, which the target runs, here without a terminal) starts the
control plane with the real node and KWOK beside it, installs the chart and prints the
kubeconfig, the image and how to stop it; `kubectl get pods -A` shows gpuop's pods Ready on
the real node; `gpuop demo --headless --kubeconfig <it>` rolls a small fleet of its own to the
end on that cluster, setting the installed gpuop aside meanwhile and putting it back; Ctrl-C
(SIGINT) stops the launcher and everything it started."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuop_sim.cluster.installed import SKIP_LABEL
from tests.support import real_node
from tests.support.control_plane import BIN, REPO

pytestmark = [pytest.mark.real_node, pytest.mark.timeout(1200)]

DEMO_NODES = 2


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


def kubectl(kubeconfig: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "kubectl"), "--kubeconfig", kubeconfig, *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_make_cluster_then_the_demo_on_it() -> None:
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
    finally:
        os.killpg(launcher.process.pid, signal.SIGINT)  # Ctrl-C
        code = launcher.process.wait(timeout=300)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    launcher.until("stopped", timeout=10)
    assert code == 0
