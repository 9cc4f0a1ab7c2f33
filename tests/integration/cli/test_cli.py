"""The `gpuop` command as a person runs it: real processes, a real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import aiohttp
import pytest

from gpuop.bus import NatsBus, NatsCluster, NatsServer
from gpuop.host.roots import HostRoot
from gpuop.runtime import services
from gpuop.runtime.settings import Role
from gpuop_sim.cli import screens
from tests.support.buses import heartbeat
from tests.support.processes import GPUOP, command_lines, descendants, free_port, gone, gpuop
from tests.support.terminals import Terminal


async def test_help_lists_the_commands() -> None:
    code, out, _ = await gpuop("--help")
    assert code == 0
    for verb in ("run", "events", "demo", "upgrade"):
        assert verb in out


async def test_a_service_connects_reports_ready_and_stops_on_sigterm(
    nats_server: NatsServer, seeded: HostRoot
) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *GPUOP, "run", "network-manager", "--node", "gpu-1.example.com",
        "--nats", nats_server.url, "--metrics-listen", f"127.0.0.1:{port}",
        "--host-root", str(seeded.path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await _poll_ready(session, port)
            async with session.get(f"http://127.0.0.1:{port}/healthz") as health:
                assert health.status == 200
            async with session.get(f"http://127.0.0.1:{port}/metrics") as metrics:
                assert "gpuop_bus_published_total" in await metrics.text()
        assert (status, body) == (200, {"ready": True})
        process.send_signal(signal.SIGUSR1)  # where does it wait? it says, and runs on
        await asyncio.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert any(line.get("node") == "gpu-1.example.com" for line in lines)
    dumped = [line for line in lines if "task dump (SIGUSR1)" in str(line)]
    assert len(dumped) > 2 and "tasks" in str(dumped[-1])


async def test_a_service_stops_within_seconds_of_sigterm_when_its_nats_is_gone(
    tmp_path: Path, seeded: HostRoot
) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.start()
    config = tmp_path / "discovery.yaml"
    config.write_text("scan_interval_seconds: 0.5\nheartbeat_interval_seconds: 0.5\n")
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *GPUOP, "run", "discovery", "--node", "gpu-1", "--nats", server.url,
        "--nats-wait", "600", "--metrics-listen", f"127.0.0.1:{port}", "--config", str(config),
        "--host-root", str(seeded.path), "--nvml", "sim:2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            await _poll_ready(session, port)
    finally:
        await server.stop()
    await asyncio.sleep(2)  # its heartbeats now wait for a server that may take 600 s
    process.send_signal(signal.SIGTERM)

    out, _ = await asyncio.wait_for(process.communicate(), 30)  # not the 600 s of --nats-wait
    assert process.returncode == 0, out.decode()[-2000:]
    assert "after the stop signal; cancelling it" in out.decode()


async def _poll_ready(session: aiohttp.ClientSession, port: int) -> tuple[int, dict[str, str]]:
    for _ in range(200):
        try:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                body = await response.json()
                if body.get("ready"):
                    return response.status, body
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError("service never answered /readyz")


async def test_run_with_a_bad_flag_exits_2_naming_the_flag() -> None:
    code, _, err = await gpuop("run", "discovery", "--node", "Not_Valid")
    assert code == 2 and "--node" in err
    code, _, err = await gpuop("run", "driver-manager", "--role", "cluster")
    assert code == 2 and "no cluster role" in err
    code, _, err = await gpuop("run", "gpu-fixer", "--role", "cluster")
    assert code == 2 and "unknown service" in err


async def test_run_without_a_reachable_nats_fails_with_exit_1(tmp_path) -> None:
    env_port = free_port()
    process = await asyncio.create_subprocess_exec(
        *GPUOP, "run", "telemetry", "--role", "cluster", "--nats", f"nats://127.0.0.1:{env_port}",
        "--nats-wait", "1", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "GPUOP_LOG_FORMAT": "text"},
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert "cannot connect" in err.decode()


async def test_events_tail_prints_stored_events_as_json_lines(nats_server: NatsServer) -> None:
    bus = NatsBus(nats_server.url)
    await bus.start()
    await bus.publish_batch([heartbeat(f"n{i}", i) for i in range(3)])
    await bus.close()
    code, out, _ = await gpuop("events", "tail", "--no-follow", "--nats", nats_server.url)
    assert code == 0
    documents = [json.loads(line) for line in out.splitlines()]
    assert [d["subject"] for d in documents] == ["n0", "n1", "n2"]
    assert all(d["type"] == "io.gpuop.hardware.heartbeat.v1" for d in documents)
    code, out, _ = await gpuop(
        "events", "tail", "--no-follow", "--nats", nats_server.url,
        "--subject", "gpuop.evt.hardware.n1.>",
    )  # fmt: skip
    assert code == 0 and len(out.splitlines()) == 1
    code, out, _ = await gpuop(
        "events", "tail", "--no-follow", "--nats", nats_server.url, "--since", "2999-01-01T00:00:00"
    )
    assert code == 0 and out == ""


async def test_events_tail_rejects_a_bad_since() -> None:
    code, _, err = await gpuop("events", "tail", "--no-follow", "--since", "yesterday")
    assert code == 2 and "--since" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_demo_shows_the_rollout_live_on_a_terminal_and_leaves_no_process_behind() -> None:
    async with Terminal("demo", "--nodes", "2", "--gpus", "1") as terminal:
        code = await terminal.exit_code(240)
    out = terminal.text
    assert code == 0, out
    metrics = r"http://127\.0\.0\.1:\d+/metrics"
    assert re.search(rf"^discovery \(gpu-node-1\)\s+\d+\s+ok\s+yes\s+{metrics}", out, re.M), out
    assert re.search(rf"^device-plugin \(gpu-node-1\)\s+\d+\s+ok\s+yes\s+{metrics}", out, re.M), out
    assert re.search(r"^gpu-node-1\s+1\s+NVIDIA-H200\s+580\.159\.04", out, flags=re.M), out
    assert screens.HIDE_CURSOR in out and out.count("\x1b[") > 100  # redrawn in place
    last = out[out.rindex("GPU driver 580.159.04 -> 580.200.01, 2 nodes") :]
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", last)
    for node in ("gpu-node-1", "gpu-node-2"):
        assert re.search(rf"{node}\s+upgrade-done\s+1\s+580\.200\.01", frame), frame
    assert "] 2/2 done, 0 failed, 0 upgrading" in frame
    assert "Latest events" in frame and "upgrade.state-changed" in frame
    assert re.search(rf"^\s+upgrade-orchestrator\s+{metrics}", frame, re.M), frame
    assert "events    gpuop events tail --nats nats://127.0.0.1:" in frame
    assert out.rstrip().endswith("}") and screens.SHOW_CURSOR in out[out.rindex("Latest") :]
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["nodes"], summary["done"], summary["failed"]) == (2, 2, 0)
    pids = [int(m) for m in re.findall(r"^\S.*?\s(\d+)\s+ok", out, flags=re.M)]
    built = list(services.installed().values())
    per_node, once = (
        sum(Role.NODE in d.roles for d in built),
        sum(Role.CLUSTER in d.roles for d in built),
    )
    assert len(pids) == 2 * per_node + once, out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_ctrl_c_stops_the_demo_and_every_process_it_started() -> None:
    # two nodes one at a time: the second waits for the first, so on a busy machine too the
    # Ctrl-C lands while the rollout runs
    demo = ("demo", "--nodes", "2", "--gpus", "1", "--max-parallel", "1")
    async with Terminal(*demo) as terminal:
        assert terminal.process is not None
        await terminal.wait_for(r"Latest events", 200)
        await terminal.wait_for(r"gpu-node-1\s+\S*(cordon|wait|pod|drain|operands)", 60)
        started = descendants(terminal.process.pid)
        assert len(started) >= 6, started  # nats-server and the services, at least
        terminal.process.send_signal(signal.SIGINT)
        code = await terminal.exit_code(60)
    assert code == 130, terminal.text
    assert screens.SHOW_CURSOR in terminal.text[terminal.text.rindex("Latest events") :]
    left = sorted(pid for pid in started if not gone(pid))
    assert not left, command_lines(left)


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_demo_headless_with_four_nodes_finishes_and_its_record_replays(tmp_path) -> None:
    record = tmp_path / "demo.jsonl"
    code, out, err = await gpuop(
        "demo", "--headless", "--nodes", "4", "--gpus", "2", "--record", str(record),
        timeout=360,
    )  # fmt: skip
    assert code == 0, err + out
    assert "pid" not in out  # plain progress lines, no process table
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["nodes"], summary["done"], summary["failed"]) == (4, 4, 0)
    assert summary["seconds"] > 0
    assert len(re.findall(r"\] gpu-node-\d\s+uncordon-required -> upgrade-done", out)) == 4
    code, out, err = await gpuop("replay", str(record))
    assert code == 0, err + out
    assert "for 4 nodes" in out and "identical" in out


async def test_demo_rejects_a_bad_size() -> None:
    code, _, err = await gpuop("demo", "--nodes", "0")
    assert code == 2 and "--nodes" in err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--nats", " , "], "--nats"),
        (["--nats", "nats://127.0.0.1:1", "--nats-replicas", "9"], "--nats-replicas"),
    ],
)
async def test_demo_rejects_a_bad_nats(flags: list[str], named: str) -> None:
    code, _, err = await gpuop("demo", *flags)
    assert code == 2 and named in err, err


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_demo_on_a_three_server_cluster_it_did_not_start(tmp_path: Path) -> None:
    async with NatsCluster(tmp_path / "nats") as cluster:
        code, out, err = await gpuop(
            "demo", "--headless", "--nodes", "2", "--gpus", "1", "--nats", cluster.url,
            timeout=300,
        )  # fmt: skip
        assert code == 0, err + out
        assert f"using NATS at {cluster.url} (3 replicas)" in out
        summary = json.loads(out.strip().splitlines()[-1])
        assert (summary["nodes"], summary["done"], summary["failed"]) == (2, 2, 0)
        bus = NatsBus(cluster.url)
        await bus.connect()
        try:
            info = await bus.js.stream_info("KV_gpuop_sagas")
            assert info.config.num_replicas == 3 and info.state.messages >= 2
        finally:
            await bus.close()
