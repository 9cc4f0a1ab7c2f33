"""Helpers for telemetry's tests: an NVML that counts and fails on demand, and scraping and
reading the exposition. Running the exporter and reading the bus: `tests.support.node_agents`."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuop.nvml import FieldValue, NvmlError
from gpuop.observability.http import HealthServer
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop_sim.nvml.sim_gpus import gpu_uuid
from tests.support.node_agents import NODE

QUIET = TelemetryConfig(
    interval_seconds=3600,
    slow_interval_seconds=3600,
    pods_interval_seconds=3600,
    retry_interval_seconds=0.05,
)
"""Intervals long enough that only what a test does makes the exporter collect."""


PROFILING = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
)
"""The profiling families issue 38 added (GPM); PCIe's were exported before."""
NVLINK_ERRORS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
RETIRED_PAGES = (
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
)
ISSUE_38 = frozenset((*PROFILING, *NVLINK_ERRORS, *RETIRED_PAGES))
"""The families issue 38 added: the profiling set, NVLink errors and retired pages."""


def uuid_of(index: int) -> str:
    """The UUID of the simulated node's GPU `index`."""
    return gpu_uuid(NODE, index)


Labels = dict[str, str]


class CountingNvml:
    """An NVML backend that counts every call by method, and fails the ones told to."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self._faults: dict[tuple[str, int | None], NvmlError] = {}

    def fail(self, method: str, error: NvmlError, index: int | None = None) -> None:
        """Make `method` raise `error`, for GPU `index` only or for every call."""
        self._faults[method, index] = error

    def heal(self) -> None:
        self._faults.clear()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            index = args[0] if args and isinstance(args[0], int) else None
            error = self._faults.get((name, index)) or self._faults.get((name, None))
            if error is not None:
                raise error
            return target(*args, **kwargs)

        return call


class SlowFields(CountingNvml):
    """Field values block until `release` is set, as a slow NVML query blocks."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.release = threading.Event()

    def field_values(self, index: int, field_ids: Sequence[int]) -> tuple[FieldValue, ...]:
        self.entered.set()
        self.release.wait(5)
        answer: tuple[FieldValue, ...] = self.inner.field_values(index, field_ids)
        return answer


def series(exposition: bytes, name: str) -> list[tuple[Labels, float]]:
    """Every sample of metric family `name` in Prometheus text (the parser of
    prometheus_client names counter samples `<name>_total`; the text itself does not)."""
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(exposition.decode())
        if family.name == name
        for sample in family.samples
    ]


def by_gpu(exposition: bytes, name: str) -> dict[str, float]:
    """The samples of `name`, by their `gpu` label."""
    return {labels["gpu"]: value for labels, value in series(exposition, name)}


Scrape = Callable[[], Awaitable[bytes]]


@asynccontextmanager
async def scraping(registry: CollectorRegistry, exporter: NodeExporter) -> AsyncIterator[Scrape]:
    """The exporter behind the service's HTTP server, and a function that scrapes its
    `/metrics` (checking that the answer is Prometheus text)."""
    async with (
        HealthServer(registry, exposition=exporter.exposition) as server,
        aiohttp.ClientSession() as client,
    ):
        assert server.address is not None
        url = "http://{}:{}/metrics".format(*server.address)

        async def scrape() -> bytes:
            async with client.get(url) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return await response.read()

        yield scrape
