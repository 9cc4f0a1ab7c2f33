"""Processes of the soak benchmark (`soak.py`): start one, sample its resident memory, stop
them all, and for `--trace` have one write what it allocated after warm-up (`_traced.py`).

Every process leads a process group of its own, so a Ctrl-C at the terminal reaches only the
benchmark, which then stops them in order, and stopping one stops whatever it started; each
also gets SIGTERM when the benchmark dies, even by SIGKILL (a timed-out `run_all.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

from tests.bench._traced import SNAPSHOT

ROOT = Path(__file__).resolve().parents[2]

OWN_ENVIRONMENT = {"GRPC_ENABLE_FORK_SUPPORT": "false", "GRPC_VERBOSITY": "ERROR"}
"""What the benchmark sets for itself (see soak.py) and keeps from the processes it starts."""
STOP_GRACE = 30.0
"""Seconds every process together has to exit after SIGTERM before its group is killed."""
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass
class Tracked:
    """One process whose resident memory is sampled."""

    name: str
    kind: str
    pid: int
    service: bool
    """Held to the target (a gpuop service), or shown for information."""
    process: asyncio.subprocess.Process | None = None
    port: int | None = None
    stopped: bool = False
    samples: list[tuple[float, int]] = field(default_factory=list)
    """(seconds into the soak, VmRSS in kB)."""

    def growth(self, warmup: float) -> tuple[float, float, float] | None:
        """(growth, first MB, last MB) after `warmup` seconds; None with under 6 samples."""
        after = [rss for at, rss in self.samples if at >= warmup]
        if len(after) < 6:
            return None
        first = statistics.median(after[:3])
        last = statistics.median(after[-3:])
        return (last - first) / first, first / 1024, last / 1024


def rss_kb(pid: int) -> int | None:
    """VmRSS of `pid` in kB; None once it is gone (a zombie has no VmRSS line)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when this benchmark dies, even by SIGKILL."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def spawn(
    name: str,
    kind: str,
    argv: list[str],
    logs: Path,
    *,
    service: bool,
    extra_environment: dict[str, str] | None = None,
) -> Tracked:
    """Start `argv` (after the interpreter) in a process group of its own, its output in
    `logs/<name>.log`; a gpuop service also gets a metrics port."""
    port = None
    if service:
        port = _free_port()
        argv = [*argv, "--metrics-listen", f"127.0.0.1:{port}", "--log-format", "json"]
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPUOP_") and k not in OWN_ENVIRONMENT
    }
    with (logs / f"{name}.log").open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *argv, stdout=sink, stderr=sink, cwd=ROOT,
            env={**environ, **(extra_environment or {}), "PYTHONUNBUFFERED": "1"},
            process_group=0,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
    return Tracked(name, kind, process.pid, service, process, port)


async def stop_all(tracked: list[Tracked]) -> dict[str, int | None]:
    """SIGTERM every started process group, SIGKILL what is left after `STOP_GRACE`; the
    exit codes (None: killed)."""
    started = [t for t in tracked if t.process is not None and not t.stopped]
    for item in started:
        item.stopped = True
        _signal_group(item.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    codes: dict[str, int | None] = {}
    for item in started:
        assert item.process is not None
        try:
            remaining = max(deadline - time.monotonic(), 0.1)
            codes[item.name] = await asyncio.wait_for(item.process.wait(), remaining)
        except TimeoutError:
            codes[item.name] = None
        _signal_group(item.pid, signal.SIGKILL)  # and whatever it started
        with contextlib.suppress(ProcessLookupError):
            await item.process.wait()
    return codes


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def tail(log: Path, keep: int = 3000) -> str:
    return f"--- {log.name}\n{log.read_text(errors='replace')[-keep:]}"


def start_tracing(traced: list[Tracked]) -> None:
    """Have every traced process start tracing its allocations (`_traced.py`)."""
    for item in traced:
        os.kill(item.pid, signal.SIGUSR2)


async def held_snapshots(traced: list[Tracked], directory: Path) -> None:
    """Have every traced process write what it allocated since and still holds, and wait."""
    for item in traced:
        os.kill(item.pid, signal.SIGUSR2)
    for item in traced:
        for _ in range(600):
            if (directory / item.name / SNAPSHOT).exists():
                break
            await asyncio.sleep(0.1)


def held_allocations(snapshot: Path, top: int = 15) -> list[str]:
    """The allocation sites holding the most memory in `snapshot`, by line and then by call
    path; imports left out (a late import is no leak)."""
    try:
        held = tracemalloc.Snapshot.load(str(snapshot))
    except OSError as error:
        return [f"no snapshot: {error}"]
    held = held.filter_traces([tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")])
    lines = [f"{sum(s.size for s in held.statistics('filename')) / 1024:.1f} KiB; by line:"]
    for stat in held.statistics("lineno")[:top]:
        frame = stat.traceback[0]
        lines.append(f"  {stat.size / 1024:9.1f} KiB {stat.count:7d} blocks  "
                     f"{frame.filename}:{frame.lineno}")  # fmt: skip
    lines.append("by call path (innermost first):")
    for stat in held.statistics("traceback")[: top // 2]:
        lines.append(f"  {stat.size / 1024:9.1f} KiB {stat.count:7d} blocks")
        lines += [f"    {line}" for line in stat.traceback.format(most_recent_first=True)]
    return lines


def write_samples(path: Path, tracked: list[Tracked]) -> None:
    """Every sample as CSV (process, kind, seconds, kB), for a look after a `--work` run."""
    lines = ["process,kind,seconds,rss_kb"]
    lines += [f"{t.name},{t.kind},{at:.1f},{rss}" for t in tracked for at, rss in t.samples]
    path.write_text("\n".join(lines) + "\n")
