"""A real Prometheus scrapes `gpuop run telemetry` on a simulated 8-GPU node: every GPU's
temperature arrives, and the framebuffer of the GPU the simulated kubelet gave a pod carries
that pod's labels, learned through PodResources on the kubelet's socket."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from gpuop.bus import NatsServer
from gpuop_sim.cluster import hosts
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from gpuop_sim.nvml.sim_gpus import gpu_uuid
from tests.integration.telemetry.support import GpuPlugin, Prometheus, free_port, prometheus_binary

NODE = "gpu-1.example.com"
GPUS = 8
TRAINER_GPU = 3

pytestmark = [pytest.mark.nats, pytest.mark.slow]


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    return hosts.build_host_root(tmp_path / "host", NODE, GPUS).path


async def eventually_query(
    prometheus: Prometheus, promql: str, count: int, timeout: float = 30
) -> list[dict[str, object]]:
    async with asyncio.timeout(timeout):
        while len(found := await prometheus.query(promql)) != count:
            await asyncio.sleep(0.25)
    return found


async def test_prometheus_scrapes_every_gpu_and_the_pod_on_one(
    nats_server: NatsServer, host_root: Path, tmp_path: Path
) -> None:
    prometheus_binary()
    uuids = [gpu_uuid(NODE, index) for index in range(GPUS)]
    config = tmp_path / "telemetry.yaml"
    config.write_text(
        "interval_seconds: 0.5\nslow_interval_seconds: 2\npods_interval_seconds: 0.5\n"
    )
    port = free_port()
    async with KubeletGrpc.under(host_root) as kubelet, GpuPlugin(uuids).registered(kubelet):
        await kubelet.allocate(
            GpuPlugin.RESOURCE, [uuids[TRAINER_GPU]], pod="trainer-0", namespace="ml"
        )
        exporter = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuop.cli.main", "run", "telemetry", "--role", "node",
            "--node", NODE, "--nats", nats_server.url, "--host-root", str(host_root),
            "--nvml", f"sim:{GPUS}", "--metrics-listen", f"127.0.0.1:{port}",
            "--config", str(config), "--log-format", "text",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            await _wait_ready(port)
            async with Prometheus(
                tmp_path / "prometheus", [f"127.0.0.1:{port}"], job="gpuop-telemetry"
            ) as prometheus:
                temperatures = await eventually_query(prometheus, "DCGM_FI_DEV_GPU_TEMP", GPUS)
                [used] = await eventually_query(
                    prometheus, 'DCGM_FI_DEV_FB_USED{pod="trainer-0"}', 1
                )
                [up] = await prometheus.query('up{job="gpuop-telemetry"}')
        finally:
            exporter.send_signal(signal.SIGTERM)
            output, _ = await asyncio.wait_for(exporter.communicate(), 20)

    assert exporter.returncode == 0, output.decode()[-3000:]
    assert sorted(sample["metric"]["gpu"] for sample in temperatures) == [  # type: ignore[index]
        str(index) for index in range(GPUS)
    ]
    labels = used["metric"]
    assert isinstance(labels, dict)
    assert labels["UUID"] == uuids[TRAINER_GPU]
    assert (labels["namespace"], labels["container"], labels["gpu"]) == ("ml", "main", "3")
    assert labels["Hostname"] == NODE
    assert up["value"][1] == "1"  # type: ignore[index]


async def _wait_ready(port: int) -> None:
    async with asyncio.timeout(60), aiohttp.ClientSession() as client:
        while True:
            try:
                async with client.get(f"http://127.0.0.1:{port}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
