"""Footprint and start-up of the node agents on one GPU node, and the demo's first admission.

Run by `tests.bench.run_all` (`make bench`), or alone:
`.venv/bin/python -m tests.bench.footprint [--quick] [--work DIR] [--no-demo]` (as root: the
node's links get a network namespace).

One simulated 8-GPU node (a host root with the simulated kubelet's gRPC side, its links in a
network namespace of its own) runs the five node agents as the chart's DaemonSets start them
(`gpuop run <service> --role node`, the chart's default configuration, one real nats-server on
loopback). Figures:

- start-up, per agent, started one at a time: wall and CPU seconds (user + system, from
  /proc/<pid>/stat) from exec until `/readyz` answers 200;
- footprint, per agent and summed: resident memory (VmRSS; and PSS, which shares the pages
  the five processes map alike, for information) and CPU share of one core, over
  `MEASURE_SECONDS` after `WARMUP_SECONDS`, with /metrics scraped every 30 s as the chart's
  ServiceMonitor does;
- the heaviest imports of each agent's role (`python -X importtime`, by own time);
- `gpuop demo --headless` with 8 nodes: seconds from exec to the first admission it prints.

Targets (issue 24): the five agents together <= 200 MB RSS and <= 0.5% of one core idle;
<= 0.5 s CPU per agent to ready; the demo's first admission <= 15 s on 2 cores.
Nothing is asserted here; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from tests.bench._processes import OWN_ENVIRONMENT

os.environ.update(OWN_ENVIRONMENT)  # the kubelet's gRPC side runs here, see soak.py

from gpuop.bus import NatsServer
from gpuop_sim.cluster import hosts
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from tests.bench._processes import Tracked, rss_kb, spawn, stop_all, tail

ROOT = Path(__file__).resolve().parents[2]
GPUS = 8
NODE = "gpu-node-1"
AGENTS = ("discovery", "driver-manager", "device-plugin", "network-manager", "telemetry")
ROLE_MODULES = {
    "discovery": "gpuop.services.discovery.node_agent",
    "driver-manager": "gpuop.services.driver_manager.agent",
    "device-plugin": "gpuop.services.device_plugin.agent",
    "network-manager": "gpuop.services.network_manager.node_agent",
    "telemetry": "gpuop.services.telemetry.node_exporter",
}
"""What `gpuop run <service> --role node` imports beyond the entry point."""
WARMUP_SECONDS = {"full": 30.0, "quick": 10.0, "smoke": 1.0}
MEASURE_SECONDS = {"full": 60.0, "quick": 20.0, "smoke": 5.0}
SAMPLE_SECONDS = 5.0
SCRAPE_SECONDS = 30.0
READY_TIMEOUT = 60.0
DEMO_TIMEOUT = 180.0
DEMO_NODES = 8
TICKS = os.sysconf("SC_CLK_TCK")
TARGETS = {
    "node_rss_mb": "<= 200",
    "node_cpu_percent": "<= 0.5",
    "max_startup_cpu_s": "<= 0.5",
    "demo_first_admission_s": "<= 15",
}


@dataclass
class Agent:
    """One node agent's figures."""

    name: str
    tracked: Tracked | None = None
    ready_wall_s: float | None = None
    ready_cpu_s: float | None = None
    rss_mb: list[float] = field(default_factory=list)
    pss_mb: float | None = None
    cpu_percent: float | None = None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds `pid` has used; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def pss_mb(pid: int) -> float | None:
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    found = re.search(r"^Pss:\s+(\d+) kB", rollup, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else None


async def http_status(port: int, path: str) -> int | None:
    """The status of GET `path` on 127.0.0.1:`port`; None when nothing answers."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


async def start_agent(agent: Agent, argv: list[str], logs: Path) -> None:
    """Start one agent and wait until it is ready; its wall and CPU time to get there."""
    began = time.monotonic()
    tracked = await spawn(agent.name, agent.name, argv, logs, service=True)
    agent.tracked = tracked
    assert tracked.port is not None and tracked.process is not None
    while time.monotonic() - began < READY_TIMEOUT:
        if tracked.process.returncode is not None:
            raise RuntimeError(
                f"{agent.name} exited while starting\n{tail(logs / (agent.name + '.log'))}"
            )
        if await http_status(tracked.port, "/readyz") == 200:
            agent.ready_wall_s = time.monotonic() - began
            agent.ready_cpu_s = cpu_seconds(tracked.pid)
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(
        f"{agent.name} not ready in {READY_TIMEOUT:g} s\n{tail(logs / (agent.name + '.log'))}"
    )


async def measure(agents: list[Agent], seconds: float) -> None:
    """RSS every `SAMPLE_SECONDS`, CPU share over `seconds`, /metrics every 30 s."""
    live = [a for a in agents if a.tracked is not None]
    first = {a.name: cpu_seconds(a.tracked.pid) for a in live if a.tracked}
    began = time.monotonic()
    scraped = began - SCRAPE_SECONDS
    while time.monotonic() - began < seconds:
        if time.monotonic() - scraped >= SCRAPE_SECONDS:
            scraped = time.monotonic()
            for agent in live:
                assert agent.tracked is not None and agent.tracked.port is not None
                await http_status(agent.tracked.port, "/metrics")
        for agent in live:
            assert agent.tracked is not None
            rss = rss_kb(agent.tracked.pid)
            if rss is not None:
                agent.rss_mb.append(rss / 1024)
        await asyncio.sleep(SAMPLE_SECONDS)
    elapsed = time.monotonic() - began
    for agent in live:
        assert agent.tracked is not None
        before, after = first[agent.name], cpu_seconds(agent.tracked.pid)
        if before is not None and after is not None:
            agent.cpu_percent = 100 * (after - before) / elapsed
        agent.pss_mb = pss_mb(agent.tracked.pid)


def heaviest_imports(module: str, top: int = 5) -> list[str]:
    """The `top` modules by own import time when `gpuop run` imports `module`."""
    found = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import gpuop.cli.main, {module}"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    rows: list[tuple[int, str]] = []
    for line in found.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[0]), parts[2].strip()))
    return [f"{name} {own / 1000:.0f}ms" for own, name in sorted(rows, reverse=True)[:top]]


async def demo_first_admission(work: Path) -> float | None:
    """Seconds from exec of `gpuop demo --headless` to the first admission it prints."""
    argv = [sys.executable, "-m", "gpuop.cli.main", "demo", "--headless",
            "--nodes", str(DEMO_NODES), "--timeout", str(DEMO_TIMEOUT)]  # fmt: skip
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=work, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        process_group=0,
    )  # fmt: skip
    assert process.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(DEMO_TIMEOUT):
            async for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip()
                seen.append(line)
                if "admitted)" in line:
                    return time.monotonic() - began
    except TimeoutError:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 60)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    print("the demo printed no admission:\n" + "\n".join(seen[-20:]), file=sys.stderr)
    return None


def netns(name: str, *action: str) -> None:
    ip = shutil.which("ip")
    if ip is None:
        raise SystemExit("the footprint benchmark needs iproute2's `ip`: apt-get install iproute2")
    subprocess.run([ip, "netns", *action, name], check=True, capture_output=True)


async def node_agents(work: Path, mode: str) -> list[Agent]:
    """Start the node's five agents, warm them up, measure them, stop them."""
    logs = work / "logs"
    logs.mkdir(parents=True)
    namespace = f"gpuop-footprint-{os.getpid()}"
    agents = [Agent(name) for name in AGENTS]
    async with AsyncExitStack() as exits:
        server = await exits.enter_async_context(NatsServer(work / "nats"))
        root = hosts.build_host_root(work / "host", NODE, GPUS)
        await exits.enter_async_context(KubeletGrpc.under(root.path))
        netns(namespace, "add")
        exits.callback(netns, namespace, "delete")
        (work / "network-manager.yaml").write_text(f"netns: {namespace}\n")
        common = ["--role", "node", "--node", NODE, "--nats", server.url]
        common += ["--host-root", str(root.path), "--nvml", f"sim:{GPUS}"]
        tracked: list[Tracked] = []
        try:
            for agent in agents:
                argv = ["-m", "gpuop.cli.main", "run", agent.name, *common]
                if agent.name == "network-manager":
                    argv += ["--config", str(work / "network-manager.yaml")]
                await start_agent(agent, argv, logs)
                assert agent.tracked is not None
                tracked.append(agent.tracked)
                print(f"{agent.name}: ready in {agent.ready_wall_s:.2f} s, "
                      f"{agent.ready_cpu_s:.2f} s CPU", flush=True)  # fmt: skip
            await asyncio.sleep(WARMUP_SECONDS[mode])
            await measure(agents, MEASURE_SECONDS[mode])
        finally:
            await stop_all(tracked)
    return agents


def summary(
    agents: list[Agent], demo: float | None, imports: dict[str, list[str]], mode: str
) -> dict[str, object]:
    rss = {a.name: max(a.rss_mb) for a in agents if a.rss_mb}
    node_rss = sum(rss.values())
    node_cpu = sum(a.cpu_percent or 0.0 for a in agents)
    startup_cpu = max(a.ready_cpu_s or 0.0 for a in agents)
    values: dict[str, float | None] = {
        "node_rss_mb": round(node_rss, 1),
        "node_cpu_percent": round(node_cpu, 2),
        "max_startup_cpu_s": round(startup_cpu, 2),
        "demo_first_admission_s": None if demo is None else round(demo, 1),
    }
    met = {
        key: value is not None and value <= float(TARGETS[key].split()[1])
        for key, value in values.items()
    }
    result: dict[str, object] = {
        "about": (
            "The five node agents of one simulated 8-GPU node (`gpuop run <service> --role "
            "node`, the chart's defaults): resident memory (the largest sample after warm-up) "
            "and CPU share of one core over the measured window, summed; each agent's wall "
            "and CPU seconds from exec to /readyz; and `gpuop demo --headless` (8 nodes) "
            "from exec to its first admission."
        ),
        "target": ", ".join(f"{k} {v}" for k, v in TARGETS.items()),
        "target_met": all(met.values()),
        "targets": TARGETS,
        "benchmark": "footprint",
        "mode": mode,
        "measured_s": MEASURE_SECONDS[mode],
        **values,
        "node_pss_mb": round(sum(a.pss_mb or 0.0 for a in agents), 1),
    }
    for agent in agents:
        key = agent.name.replace("-", "_")
        result[f"{key}_rss_mb"] = round(rss.get(agent.name, 0.0), 1)
        result[f"{key}_cpu_percent"] = round(agent.cpu_percent or 0.0, 2)
        result[f"{key}_ready_s"] = round(agent.ready_wall_s or 0.0, 2)
        result[f"{key}_ready_cpu_s"] = round(agent.ready_cpu_s or 0.0, 2)
    for name, heaviest in imports.items():
        result[f"{name.replace('-', '_')}_heaviest_imports"] = heaviest
    return result


async def run(mode: str, work: Path, *, no_demo: bool = False) -> dict[str, object]:
    task = asyncio.current_task()
    assert task is not None
    # a SIGTERM (run_all's timeout, a Ctrl-C's sibling) unwinds like a cancel, so the agents,
    # nats-server and the network namespace are cleaned up on the way out
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    agents = await node_agents(work / "node", mode)
    imports = {name: heaviest_imports(module) for name, module in ROLE_MODULES.items()}
    demo_dir = work / "demo"
    demo_dir.mkdir()
    demo = None if no_demo else await demo_first_admission(demo_dir)
    print(f"demo: first admission after {demo if demo is None else round(demo, 1)} s", flush=True)
    return summary(agents, demo, imports, mode)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a shorter warm-up and window")
    parser.add_argument("--work", type=Path, help="keep logs and host root here")
    parser.add_argument(
        "--smoke", action="store_true", help="a 5 s window, no demo: does it still run"
    )
    parser.add_argument("--no-demo", action="store_true", help="leave out the demo's start")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("the footprint benchmark needs root: the node's links live in a netns")
    with contextlib.ExitStack() as cleanup:
        if args.work is None:
            work = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="gpuop-fp-")))
        else:
            work = args.work
            work.mkdir(parents=True, exist_ok=True)
        mode = "smoke" if args.smoke else "quick" if args.quick else "full"
        result = asyncio.run(run(mode, work, no_demo=args.no_demo or args.smoke))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
