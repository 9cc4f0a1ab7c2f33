"""`gpuop demo`: the embedded stack on one machine, shown as it is.

Starts a real nats-server and every installed service as its own process (node roles for a
simulated node, cluster roles once), then reports what each says on /readyz. Services that
are not built yet say so; the demo never fakes an upgrade. Ctrl-C (or the end of the demo)
stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gpuop.bus import NatsServer
from gpuop.runtime import services
from gpuop.runtime.settings import Role

NODE = "demo-node-1"


def add_parser(verbs: Any) -> None:
    demo: argparse.ArgumentParser = verbs.add_parser(
        "demo",
        help="run the whole stack locally and show it",
        description="Start nats-server and every service locally, and show their state.",
    )
    demo.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node")
    demo.add_argument("--hold", action="store_true", help="keep running until Ctrl-C")
    demo.set_defaults(handler=run_demo)


@dataclass
class Process:
    service: str
    role: Role
    port: int
    process: asyncio.subprocess.Process

    @property
    def label(self) -> str:
        return f"{self.service} ({self.role})"


async def run_demo(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if not 1 <= args.gpus <= 64:
        raise ValueError(f"--gpus {args.gpus}: expected 1 to 64")
    with tempfile.TemporaryDirectory(prefix="gpuop-demo-") as workdir:
        async with NatsServer(Path(workdir) / "nats") as server:
            print(f"nats-server (JetStream) listening on {server.url}")
            processes: list[Process] = []
            try:
                for definition in services.installed().values():
                    for role in sorted(definition.roles):
                        processes.append(
                            await _spawn(definition.name, role, server.url, args, workdir)
                        )
                await _show(processes)
                print()
                print("Tail events with:")
                print(f"  gpuop events tail --nats {server.url}")
                _say_what_is_missing()
                if args.hold:
                    print("\nRunning; press Ctrl-C to stop.")
                    await asyncio.Event().wait()
            finally:
                await _stop_all(processes)
    return 0


async def _spawn(
    service: str, role: Role, nats_url: str, args: argparse.Namespace, workdir: str
) -> Process:
    port = _free_port()
    command = [
        sys.executable, "-m", "gpuop.cli.main", "run", service,
        "--role", role, "--nats", nats_url,
        "--metrics-listen", f"127.0.0.1:{port}", "--log-format", "json",
    ]  # fmt: skip
    if role is Role.NODE:
        command += ["--node", NODE, "--nvml", f"sim:{args.gpus}", "--host-root", workdir]
    log = Path(workdir) / f"{service}-{role}.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=sink, stderr=sink, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    return Process(service, role, port, process)


async def _show(processes: list[Process]) -> None:
    print(f"\n{'service':<36} {'pid':>7}  {'health':<8} ready")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        for proc in processes:
            health, ready = await _probe(session, proc)
            print(f"{proc.label:<36} {proc.process.pid:>7}  {health:<8} {ready}")


async def _probe(session: aiohttp.ClientSession, proc: Process) -> tuple[str, str]:
    base = f"http://127.0.0.1:{proc.port}"
    for _ in range(150):
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


def _say_what_is_missing() -> None:
    pending = {d.name: d.pending_issue for d in services.installed().values() if d.main is None}
    if not pending:
        return
    print("\nNot built yet, so no driver upgrade runs in this demo:")
    for name, issue in pending.items():
        print(f"  - {name}: issue {issue}")
    print("  - simulated Kubernetes cluster (gpuop.sim), Helm chart and live rollout view")


async def _stop_all(processes: list[Process]) -> None:
    for proc in processes:
        if proc.process.returncode is None:
            proc.process.terminate()
    for proc in processes:
        try:
            await asyncio.wait_for(proc.process.wait(), 10)
        except TimeoutError:
            proc.process.kill()
            with contextlib.suppress(ProcessLookupError):
                await proc.process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
