"""MPS sharing in tests: configs as an operator writes them, and a look at the stand-in
`nvidia-cuda-mps-control` daemons a simulated host root runs (their pid files, their answers),
with a way to end any a failed test left behind."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin.config import DEFAULT_MPS_ROOT
from gpuop_sim.host import mpscontrol

GPU = "nvidia.com/gpu"


def mps_document(replicas: int = 4, **mps: Any) -> dict[str, Any]:
    """A config sharing `nvidia.com/gpu` with MPS, `replicas` clients per GPU; `mps` adds
    keys of `sharing.mps` (`renameByDefault=True`)."""
    return {"sharing": {"mps": {"resources": [{"name": GPU, "replicas": replicas}], **mps}}}


def pipe_dir(root: HostRoot, resource: str = GPU) -> Path:
    """The pipe directory of `resource`'s daemon in the host root."""
    return root.join(f"{DEFAULT_MPS_ROOT}/{resource}/pipe")


def log_file(root: HostRoot, resource: str = GPU) -> Path:
    """The control log of `resource`'s daemon in the host root."""
    return root.join(f"{DEFAULT_MPS_ROOT}/{resource}/log/{mpscontrol.LOG_FILE}")


def daemon_pid(root: HostRoot, resource: str = GPU) -> int | None:
    """The pid of the daemon of `resource` that runs and answers; None when none does."""
    pipe = pipe_dir(root, resource)
    try:
        pid = int((pipe / mpscontrol.PID_FILE).read_text())
        mpscontrol.ask(pipe, "get_server_list", timeout=2.0)
    except (OSError, ValueError):
        return None
    return pid


def ask(root: HostRoot, command: str, resource: str = GPU) -> str:
    """The answer of `resource`'s daemon to `command` (raises `OSError` without one)."""
    status, answer = mpscontrol.ask(pipe_dir(root, resource), command)
    assert status == 0, answer
    return answer


def received(root: HostRoot, resource: str = GPU) -> list[str]:
    """Every command the daemons of `resource` were sent, in order, from their log."""
    try:
        lines = log_file(root, resource).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [line.split("] Command: ", 1)[1] for line in lines if "] Command: " in line]


def end_daemons(root: HostRoot) -> None:
    """SIGKILL every stand-in daemon whose pid file lies under the host root's MPS root."""
    for pid_file in root.join(DEFAULT_MPS_ROOT).rglob(mpscontrol.PID_FILE):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
