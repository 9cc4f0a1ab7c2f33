"""What telemetry's integration tests run beside it: a stand-in GPU device plugin the
simulated kubelet allocates through, a real Prometheus on loopback, and free ports."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from gpuop.kubelet import constants
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc


def prometheus_binary() -> str:
    """The prometheus executable; fails the test, saying what to install, where it is
    missing."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "Debian's prometheus is not installed: apt-get install -y --no-install-recommends"
            " prometheus (.ci/run does)"
        )
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class GpuPlugin(api_pb2_grpc.DevicePluginServicer):
    """Advertises fixed `nvidia.com/gpu` ids and allocates them, nothing more: enough for the
    simulated kubelet to place a pod on a GPU and list it in PodResources."""

    RESOURCE = "nvidia.com/gpu"
    ENDPOINT = "telemetry-test-gpu.sock"

    def __init__(self, device_ids: Sequence[str]) -> None:
        self.devices = [api_pb2.Device(ID=i, health=constants.HEALTHY) for i in device_ids]
        self._stopped = asyncio.Event()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        yield api_pb2.ListAndWatchResponse(devices=self.devices)
        await self._stopped.wait()

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse() for _ in request.container_requests
            ]
        )

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        raise NotImplementedError

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def registered(self, kubelet: KubeletGrpc) -> AsyncIterator[None]:
        """Serve on the kubelet's device-plugin directory and register, until the end."""
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        target = UnixTarget(kubelet.device_plugin_dir / self.ENDPOINT)
        server.add_insecure_port(target.address)
        await server.start()
        kubelet_target = UnixTarget(kubelet.kubelet_socket)
        try:
            async with grpc.aio.insecure_channel(kubelet_target.address) as channel:
                await api_pb2_grpc.RegistrationStub(channel).Register(
                    api_pb2.RegisterRequest(
                        version=constants.VERSION,
                        endpoint=self.ENDPOINT,
                        resource_name=self.RESOURCE,
                    )
                )
            await kubelet.wait_for_devices(self.RESOURCE, lambda d: len(d) == len(self.devices))
            yield
        finally:
            self._stopped.set()
            await server.stop(None)
            target.close()
            kubelet_target.close()


class Prometheus:
    """Debian's prometheus on loopback: temp config and data, a random port, stopped at exit."""

    def __init__(self, workdir: Path, targets: Sequence[str], *, job: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._targets = targets
        self._job = job
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Prometheus:
        binary = prometheus_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        targets = ", ".join(f'"{t}"' for t in self._targets)
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            f"scrape_configs:\n  - job_name: {self._job}\n"
            f"    static_configs:\n      - targets: [{targets}]\n"
        )
        with (self.workdir / "prometheus.log").open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        try:
            await self._ready()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector `promql` evaluates to now."""
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"{self.url}/api/v1/query", params={"query": promql}) as response,
        ):
            answer = await response.json()
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    async def _ready(self) -> None:
        async with asyncio.timeout(30), aiohttp.ClientSession() as client:
            while True:
                assert self._process is not None
                if self._process.returncode is not None:
                    log = (self.workdir / "prometheus.log").read_text()
                    raise RuntimeError(f"prometheus exited: {log[-2000:]}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with client.get(f"{self.url}/-/ready") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
