"""Service processes for `gpuop demo`: start one, probe its /readyz, stop them all.

Every service runs as its own `gpuop run` process, exactly as in a DaemonSet or Deployment,
with its log in the demo's work directory. Each one leads a process group of its own, so a
Ctrl-C at the terminal reaches only the demo, which then stops the services in order, and
stopping a service stops whatever it started: `stop_all` signals the whole group (SIGTERM,
then SIGKILL after `STOP_GRACE`), so no process outlives the demo. A demo that dies without
stopping them (SIGKILL) takes them along: each gets SIGTERM when its parent dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gpuop.bus.launcher import exiting_with_parent
from gpuop.runtime.settings import Role

STOP_GRACE = 10.0
"""Seconds a service has to stop after SIGTERM before its process group is killed."""


@dataclass
class Process:
    service: str
    role: Role
    node: str | None
    port: int
    process: asyncio.subprocess.Process

    @property
    def label(self) -> str:
        return f"{self.service} ({self.node or self.role})"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


async def spawn(
    service: str, role: Role, node: str | None, nats_url: str, extra: list[str], work: Path
) -> Process:
    port = _free_port()
    command = exiting_with_parent([
        sys.executable, "-m", "gpuop.cli.main", "run", service,
        "--role", role, "--nats", nats_url,
        "--metrics-listen", f"127.0.0.1:{port}", "--log-format", "json", *extra,
    ])  # fmt: skip
    log = work / f"{service}-{node or role}.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdout=sink,
            stderr=sink,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            process_group=0,
        )
    return Process(service, role, node, port, process)


STARTUP_WAIT = 60.0
"""Seconds `show` waits for a service to answer: a dozen Python processes start at once, and
on two busy cores the last of them may take most of a minute."""


async def show(processes: list[Process]) -> None:
    print(f"\n{'service':<36} {'pid':>7}  {'health':<8} {'ready':<5}  metrics")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        for proc in processes:
            health, ready = await _probe(session, proc)
            print(
                f"{proc.label:<36} {proc.process.pid:>7}  {health:<8} {ready:<5}  "
                f"{proc.metrics_url}"
            )


async def _probe(session: aiohttp.ClientSession, proc: Process) -> tuple[str, str]:
    base = f"http://127.0.0.1:{proc.port}"
    deadline = asyncio.get_running_loop().time() + STARTUP_WAIT
    while asyncio.get_running_loop().time() < deadline:
        if proc.process.returncode is not None:
            return "exited", f"exit code {proc.process.returncode}"
        try:
            async with session.get(f"{base}/readyz") as response:
                body = json.loads(await response.text())
                if response.status == 200:
                    return "ok", "yes"
                if body.get("reason") != "starting":
                    return "ok", f"no: {body.get('reason')}"
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
            pass
        await asyncio.sleep(0.1)
    return "no answer", "unknown"


async def stop_all(processes: list[Process]) -> None:
    """SIGTERM every service's process group, wait, then SIGKILL what is left of each."""
    for proc in processes:
        if proc.process.returncode is None:
            _signal_group(proc, signal.SIGTERM)
    for proc in processes:
        try:
            await asyncio.wait_for(proc.process.wait(), STOP_GRACE)
        except TimeoutError:
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                await proc.process.wait()
        _signal_group(proc, signal.SIGKILL)  # anything the service started and left behind


STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""What `timeout`, a CI runner or a closed terminal sends; each stops the demo as Ctrl-C does."""


@contextlib.contextmanager
def cancelled_on_signals() -> Iterator[list[signal.Signals]]:
    """While inside, the first SIGTERM or SIGHUP cancels the current task, so its cleanup
    (stopping every process it started) runs as after Ctrl-C; later ones are ignored so that
    cleanup is not cut short. Yields the signals received, in order."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[signal.Signals] = []

    def cancel(signum: signal.Signals) -> None:
        received.append(signum)
        if len(received) == 1:
            task.cancel()

    for signum in STOPPING_SIGNALS:
        loop.add_signal_handler(signum, cancel, signum)
    try:
        yield received
    finally:
        for signum in STOPPING_SIGNALS:
            loop.remove_signal_handler(signum)


def _signal_group(proc: Process, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.process.pid, signum)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
