"""The `gpuop` command as a person runs it: real processes, a real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys

import aiohttp
import pytest

from gpuop.bus import NatsBus, NatsServer
from tests.integration.bus.support import heartbeat

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


async def test_help_lists_the_commands() -> None:
    code, out, _ = await gpuop("--help")
    assert code == 0
    for verb in ("run", "events", "demo"):
        assert verb in out


async def test_placeholder_service_connects_reports_not_built_and_stops_on_sigterm(
    nats_server: NatsServer,
) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *GPUOP, "run", "network-manager", "--node", "gpu-1.example.com",
        "--nats", nats_server.url, "--metrics-listen", f"127.0.0.1:{port}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await _poll_ready(session, port)
            async with session.get(f"http://127.0.0.1:{port}/healthz") as health:
                assert health.status == 200
            async with session.get(f"http://127.0.0.1:{port}/metrics") as metrics:
                assert "gpuop_bus_published_total" in await metrics.text()
        assert status == 503
        assert body["reason"] == "network-manager is not built yet (issue 8)"
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert any(line.get("node") == "gpu-1.example.com" for line in lines)


async def _poll_ready(session: aiohttp.ClientSession, port: int) -> tuple[int, dict[str, str]]:
    for _ in range(200):
        try:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                body = await response.json()
                if body.get("reason") != "starting":
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
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
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
async def test_demo_rolls_a_driver_upgrade_and_leaves_no_process_behind() -> None:
    code, out, err = await gpuop("demo", "--nodes", "2", "--gpus", "2", timeout=240)
    assert code == 0, err + out
    assert re.search(r"^discovery \(gpu-node-1\)\s+\d+\s+ok\s+yes$", out, flags=re.M), out
    assert re.search(r"^gpu-node-1\s+2\s+NVIDIA-H200\s+580\.159\.04", out, flags=re.M), out
    for node in ("gpu-node-1", "gpu-node-2"):
        assert re.search(rf"{node}\s+uncordon-required -> upgrade-done", out), out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["nodes"] == 2 and summary["done"] == 2 and summary["failed"] == 0
    assert "device-plugin: issue 6" in out
    pids = [int(m) for m in re.findall(r"^\S.*?\s(\d+)\s+ok", out, flags=re.M)]
    assert len(pids) == 6, out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_demo_headless_records_a_log_that_replays_identically(tmp_path) -> None:
    record = tmp_path / "demo.jsonl"
    code, out, err = await gpuop(
        "demo", "--headless", "--nodes", "1", "--gpus", "1", "--record", str(record), timeout=240
    )
    assert code == 0, err + out
    assert "pid" not in out
    assert "gpu-node-1     uncordon-required -> upgrade-done" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["nodes"], summary["done"], summary["failed"]) == (1, 1, 0)
    assert summary["seconds"] > 0
    code, out, err = await gpuop("replay", str(record))
    assert code == 0, err + out
    assert "identical" in out


async def test_demo_rejects_a_bad_size() -> None:
    code, _, err = await gpuop("demo", "--nodes", "0")
    assert code == 2 and "--nodes" in err
