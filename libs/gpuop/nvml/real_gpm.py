"""GPM through nvidia-ml-py: `PynvmlBackend.activity()` (see `profiling`).

`GpmSampler` keeps the last sample of each GPU and GPU instance; a call takes a new one
(`nvmlGpmSampleGet`, or `nvmlGpmMigSampleGet` for a GPU instance), asks
`nvmlGpmMetricsGet` for the interval between the two and keeps the new sample for the next
call. A GPU without GPM support is remembered, so it costs one support query per session.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpuop.nvml.binding import Binding
from gpuop.nvml.errors import NotSupported, NvmlError
from gpuop.nvml.profiling import Activity, GpmMetric, from_gpm

Key = tuple[int, int | None]


class GpmSampler:
    """The GPM samples of one NVML session; `free()` when the session closes."""

    def __init__(self, nvml: Binding) -> None:
        self._nvml = nvml
        self._previous: dict[Key, Any] = {}
        self._supported: dict[int, bool] = {}

    def activity(self, index: int, handle: Any, gpu_instance_id: int | None) -> Activity:
        """The GPU's (or instance's) activity since the last call for it; raises
        `NotSupported` where the GPU has no GPM."""
        if not self._supports(index, handle):
            raise NotSupported(f"GPU {index}: no GPM (nvmlGpmQueryDeviceSupport)")
        nvml = self._nvml
        sample = nvml.call("nvmlGpmSampleAlloc")
        try:
            if gpu_instance_id is None:
                nvml.call("nvmlGpmSampleGet", handle, sample)
            else:
                nvml.call("nvmlGpmMigSampleGet", handle, gpu_instance_id, sample)
        except NvmlError:
            nvml.call("nvmlGpmSampleFree", sample)
            raise
        previous = self._previous.pop((index, gpu_instance_id), None)
        self._previous[index, gpu_instance_id] = sample
        if previous is None:
            return Activity(index, gpu_instance_id)
        try:
            return from_gpm(index, gpu_instance_id, self._values(previous, sample))
        finally:
            nvml.call("nvmlGpmSampleFree", previous)

    def free(self) -> None:
        """Free every kept sample (before `nvmlShutdown`)."""
        for sample in self._previous.values():
            with contextlib.suppress(NvmlError):
                self._nvml.call("nvmlGpmSampleFree", sample)
        self._previous.clear()
        self._supported.clear()

    def _supports(self, index: int, handle: Any) -> bool:
        if index not in self._supported:
            support = self._nvml.optional("nvmlGpmQueryDeviceSupport", handle)
            self._supported[index] = bool(support is not None and support.isSupportedDevice)
        return self._supported[index]

    def _values(self, first: Any, second: Any) -> dict[int, float]:
        lib = self._nvml.lib
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GpmMetric)
        request.sample1 = first
        request.sample2 = second
        for slot, metric in enumerate(GpmMetric):
            request.metrics[slot].metricId = int(metric)
        answer = self._nvml.call("nvmlGpmMetricsGet", request)
        return {
            int(answer.metrics[slot].metricId): float(answer.metrics[slot].value)
            for slot in range(len(GpmMetric))
            if answer.metrics[slot].nvmlReturn == 0
        }
