"""The demo as CI, `timeout` and a closed terminal meet it: headless output that is gpuop's
own and nothing else, a footer to drive it by with `--hold`, SIGTERM and SIGKILL mid-rollout
leaving no process behind, and a one-node cluster that finishes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import pytest

from tests.support.processes import GPUOP, command_lines, descendants, gpuop

OWN_LINES = [
    r"nats-server \(JetStream\) listening on nats://127\.0\.0\.1:\d+",
    r"simulated cluster: \d+ nodes x \d+ GPUs at https://127\.0\.0\.1:\d+",
    r"cluster of \S+: \d+ KWOK nodes x \d+ GPUs",  # with --kubeconfig
    r"rolling GPU driver \S+ -> \S+, \d+ nodes, \S+ at a time",
    r"\[ *\d+\.\ds\] gpu-node-\d+ +\S+ -> \S+  \(.*\)",
    r"(metrics|events|rollout|cluster|) +\S.*",  # the footer
    r"Ctrl-C stops everything\.",
    r"Running; Ctrl-C \(or SIGTERM\) stops it\.",
    r"stopped by SIG[A-Z]+; every process it started is stopped",
    r"\{\"nodes\": \d+, .*\}",
    r"",
]
"""Every line `gpuop demo --headless` may print; gRPC's or any library's lines are none."""
FOOTER = [
    r"^events +gpuop events tail --nats nats://127\.0\.0\.1:\d+$",
    r"^rollout +gpuop upgrade status --kubeconfig \S+kubeconfig --nats nats://\S+$",
    r"^cluster +kubectl --kubeconfig \S+kubeconfig get nodes$",
]


def foreign(lines: list[str]) -> list[str]:
    return [line for line in lines if not any(re.fullmatch(own, line) for own in OWN_LINES)]


def test_the_check_sees_a_grpc_line() -> None:
    grpc = "I1201 17:09:08.514090 12315 chttp2_transport.cc:1403] unix:///x.sock: Got goaway"
    assert foreign([grpc, "rolling GPU driver 1 -> 2, 2 nodes, 2 at a time"]) == [grpc]


class Demo:
    """`gpuop demo --headless` with its stdout and stderr read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._readers = [
            asyncio.create_task(self._read(stream))
            for stream in (process.stdout, process.stderr)
            if stream is not None
        ]

    @classmethod
    async def start(cls, *args: str) -> Demo:
        process = await asyncio.create_subprocess_exec(
            *GPUOP, "demo", "--headless", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        return cls(process)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    async def wait_for(self, pattern: str, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not any(re.search(pattern, line) for line in self.lines):
                if self.process.returncode is not None:
                    raise AssertionError(f"the demo exited before {pattern!r}: {self.lines}")
                await asyncio.sleep(0.1)

    async def exit_code(self, timeout: float) -> int:
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await asyncio.gather(*self._readers)
        return code

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed demo's children are reaped by whoever adopts them)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def none_running(pids: set[int], timeout: float) -> list[int]:
    """The pids still running after up to `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (left := sorted(pid for pid in pids if running(pid))) and loop.time() < deadline:
        await asyncio.sleep(0.2)
    return left


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_headless_output_is_gpuop_s_own_and_hold_prints_the_footer() -> None:
    demo = await Demo.start("--nodes", "2", "--gpus", "1", "--hold")
    try:
        await demo.wait_for(r"^Running; Ctrl-C", 300)
        for line in FOOTER:
            assert any(re.search(line, seen) for seen in demo.lines), (line, demo.lines)
        demo.process.send_signal(signal.SIGTERM)
        code = await demo.exit_code(60)
    finally:
        await demo.close()
    assert code == 128 + signal.SIGTERM, demo.lines
    assert foreign(demo.lines) == []
    summary = json.loads(next(line for line in demo.lines if line.startswith('{"nodes"')))
    assert (summary["nodes"], summary["done"], summary["failed"]) == (2, 2, 0)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_a_signal_mid_rollout_leaves_no_process_behind(signum: signal.Signals) -> None:
    demo = await Demo.start("--nodes", "2", "--gpus", "1", "--max-parallel", "1", "--hold")
    try:
        await demo.wait_for(r"gpu-node-\d +upgrade-required -> cordon-required", 240)
        started = descendants(demo.process.pid)
        assert len(started) >= 6, started  # nats-server and the services, at least
        demo.process.send_signal(signum)
        code = await demo.exit_code(60)
    finally:
        await demo.close()
    assert code == (128 + signum if signum != signal.SIGKILL else -signum), demo.lines
    left = await none_running(started, 30)
    assert not left, command_lines(left)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_one_node_demo_finishes() -> None:
    code, out, err = await gpuop("demo", "--headless", "--nodes", "1", "--gpus", "2", timeout=240)
    assert code == 0, err + out
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["nodes"], summary["done"], summary["failed"]) == (1, 1, 0)
