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
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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


STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, and what `timeout`, a CI runner or a closed terminal sends: each stops the demo."""

T = TypeVar("T")


class Stopped(Exception):
    """A stopping signal arrived; `signum` is the first."""

    def __init__(self, signum: signal.Signals) -> None:
        super().__init__(f"stopped by {signum.name}")
        self.signum = signum


class Stop:
    """The stopping signals received while `watching`; `unless_stopped` ends a wait early."""

    def __init__(self) -> None:
        self.received: list[signal.Signals] = []
        self.requested = asyncio.Event()

    def _on_signal(self, signum: signal.Signals) -> None:
        self.received.append(signum)
        self.requested.set()

    async def unless_stopped(self, work: Awaitable[T]) -> T:
        """The result of `work`, unless a stopping signal comes first: then `work` is
        cancelled and `Stopped` raised, so the caller's cleanup runs as after the end.

        No cancellation is sent into the caller itself: a library that swallows one (Python
        3.11's `wait_for`, racing a result, does) would make it run on. `work` is cancelled
        again every second until it ends."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.create_task(self.requested.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the caller itself was cancelled
            task.cancel()
            raise
        finally:
            stopping.cancel()
        if task.done():
            return task.result()
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        raise Stopped(self.received[0])


@contextlib.contextmanager
def watching() -> Iterator[Stop]:
    """While inside, SIGINT, SIGTERM and SIGHUP ask the demo to stop (`Stop`); later ones
    change nothing, so the cleanup they start is not cut short."""
    loop = asyncio.get_running_loop()
    stop = Stop()
    for signum in STOPPING_SIGNALS:
        loop.add_signal_handler(signum, stop._on_signal, signum)
    try:
        yield stop
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
