"""The `gpuop` command and the processes it starts, as tests see them from outside: `gpuop`
runs one command, `service` runs one `gpuop run` for the length of a block (with the fast
agent configs below; `node_agents` and `cluster_discovery` those of a simulated cluster's
rollout), and `descendants` finds what a process started."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from gpuop.bus.launcher import exiting_with_parent
from gpuop.host.roots import HostRoot
from gpuop_sim.host import keys

GPUOP = [sys.executable, "-m", "gpuop.cli.main"]


async def gpuop(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *GPUOP, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def command_lines(pids: list[int]) -> list[bytes]:
    return [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids]


def gone(pid: int) -> bool:
    """No such process (a zombie nobody reaped is one left behind too)."""
    return not Path(f"/proc/{pid}").exists()


DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
DISCOVERY_CONFIG = (
    "scan_interval_seconds: 1\nheartbeat_interval_seconds: 0.5\nretry_interval_seconds: 0.2\n"
)
DRIVER_MANAGER_CONFIG = f"kernel: auto\nunload_poll_seconds: 0.1\ntrust: {json.dumps(keys.TRUST)}\n"


async def start_service(arguments: Iterable[str], log: Path) -> asyncio.subprocess.Process:
    """`gpuop run <arguments>` as a process logging to `log`, in an environment without the
    caller's `GPUOP_*` settings; it gets SIGTERM if the test process dies."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUOP_")}
    command = [sys.executable, "-m", "gpuop.cli.main", "run", *arguments, "--log-format", "text"]
    with log.open("ab") as output:
        return await asyncio.create_subprocess_exec(
            *exiting_with_parent(command), stdout=output, stderr=output,
            env={**environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


@asynccontextmanager
async def service(
    name: str, arguments: list[str], log: Path, exit_codes: dict[str, int | None]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`gpuop run <arguments>` as a process, stopped with SIGTERM (then SIGKILL) at the end;
    its exit code lands in `exit_codes[name]`."""
    process = await start_service(arguments, log)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
                exit_codes[name] = None  # did not stop on SIGTERM
            else:
                exit_codes[name] = process.returncode
        else:
            exit_codes[name] = process.returncode


async def node_agents(
    stack: contextlib.AsyncExitStack,
    work: Path,
    nats_url: str,
    roots: Mapping[str, HostRoot],
    gpus: int,
    logs: list[Path],
    exit_codes: dict[str, int | None],
) -> None:
    """Discovery (node role) and the driver-manager of each node as `gpuop run` processes on
    its host root in `roots`, NVML simulated with `gpus` GPUs, with the fast configs (written
    into `work`), for the length of `stack`; each log goes into `logs`."""
    (work / "discovery.yaml").write_text(DISCOVERY_CONFIG)
    (work / "driver-manager.yaml").write_text(DRIVER_MANAGER_CONFIG)
    for node, root in roots.items():
        on_node = ["--node", node, "--nats", nats_url, "--host-root", str(root.path)]
        on_node += ["--nvml", f"sim:{gpus}"]
        for name, arguments in (
            ("discovery", ["--role", "node", "--config", f"{work}/discovery.yaml"]),
            ("driver-manager", ["--config", f"{work}/driver-manager.yaml"]),
        ):
            log = work / f"{name}-{node}.log"
            logs.append(log)
            await stack.enter_async_context(
                service(f"{name}-{node}", [name, *on_node, *arguments], log, exit_codes)
            )


async def cluster_discovery(
    stack: contextlib.AsyncExitStack,
    work: Path,
    nats_url: str,
    kubeconfig: Path,
    logs: list[Path],
    exit_codes: dict[str, int | None],
) -> None:
    """Discovery's cluster role (node labels) as a `gpuop run` process for the length of
    `stack`, logging into `work`."""
    log = work / "discovery-cluster.log"
    logs.append(log)
    arguments = ["discovery", "--role", "cluster", "--nats", nats_url]
    await stack.enter_async_context(
        service("discovery-cluster", [*arguments, "--kubeconfig", str(kubeconfig)], log, exit_codes)
    )
