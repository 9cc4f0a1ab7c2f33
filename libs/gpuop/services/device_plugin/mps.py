"""MPS sharing as the config in force asks for it: which MPS control daemons, with which
limits, and what a container given a replica of an MPS-shared GPU gets. Pure: `mpscontrol`
runs and supervises the daemons.

Upstream's layout on the host, under `flags.mpsRoot` (`/run/nvidia/mps`):

    <mpsRoot>/<resource>/pipe   the daemon's CUDA_MPS_PIPE_DIRECTORY; a container sees it at
                                /mps/<resource>/pipe, and its CUDA_MPS_PIPE_DIRECTORY says so
    <mpsRoot>/<resource>/log    the daemon's CUDA_MPS_LOG_DIRECTORY
    <mpsRoot>/shm               every MPS client's /dev/shm

One daemon per shared resource (`nvidia.com/gpu`, or `nvidia.com/gpu.shared` renamed), with
upstream's default client limits, set through its control pipe once it runs:

    set_default_device_pinned_mem_limit <index> <memory/replicas>M   for each GPU (MiB)
    set_default_active_thread_percentage <100/replicas>

A container is handed the same limits as its own MPS client settings,
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
(`<ordinal>=<n>M,...`, the ordinals its CUDA sees: 0 for the first GPU it was given); a
client may lower the daemon's defaults but never raise them. Upstream hands out the pipe
directory only and relies on the daemon's defaults alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuop.services.device_plugin.inventory import Target

CONTAINER_ROOT = "/mps"
"""Where a container sees the MPS root (upstream's)."""
CONTAINER_SHM = "/dev/shm"
"""Where a container sees the MPS root's `shm`."""
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
"""The MPS pipe directory, for the daemon and its clients."""
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
"""The MPS log directory of the daemon."""
THREAD_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
"""A client's share of each GPU's threads, in percent."""
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
"""A client's device memory limit per GPU: `0=4096M,1=4096M`."""
MIB = 1 << 20


@dataclass(frozen=True)
class MpsGpu:
    """One GPU an MPS daemon shares."""

    index: int
    """NVML index: how the daemon's limit commands name the GPU (upstream's way)."""
    uuid: str
    memory_limit_mib: int
    """Each client's pinned device memory on it; 0 when the GPU's memory is unknown (no
    limit is set then)."""


@dataclass(frozen=True)
class MpsDaemon:
    """One MPS control daemon: the resource it serves, where it lives, and its limits."""

    resource: str
    """The advertised resource: `nvidia.com/gpu` or `nvidia.com/gpu.shared`."""
    replicas: int
    """Clients per GPU."""
    gpus: tuple[MpsGpu, ...]
    """The GPUs it shares, by index."""
    mps_root: str
    """The host directory of every daemon (`flags.mpsRoot`)."""

    @property
    def pipe_dir(self) -> str:
        """Its pipe directory on the host."""
        return f"{self._base}/pipe"

    @property
    def log_dir(self) -> str:
        """Its log directory on the host."""
        return f"{self._base}/log"

    @property
    def shm_dir(self) -> str:
        """The clients' shared memory directory on the host."""
        return f"{self.mps_root.rstrip('/')}/shm"

    @property
    def container_pipe_dir(self) -> str:
        """Its pipe directory as a container sees it."""
        return f"{CONTAINER_ROOT}/{self.resource}/pipe"

    @property
    def thread_percentage(self) -> int:
        """Each client's share of a GPU's threads."""
        return 100 // self.replicas

    @property
    def limit_commands(self) -> tuple[str, ...]:
        """What is written to its control pipe once it runs, in order (upstream's)."""
        memory = tuple(
            f"set_default_device_pinned_mem_limit {gpu.index} {gpu.memory_limit_mib}M"
            for gpu in self.gpus
            if gpu.memory_limit_mib > 0
        )
        return (*memory, f"set_default_active_thread_percentage {self.thread_percentage}")

    def client_environment(self, targets: Sequence[Target]) -> dict[str, str]:
        """The MPS variables of a container given `targets` (its distinct GPUs, in the
        order it sees them)."""
        env = {PIPE_ENV: self.container_pipe_dir, THREAD_ENV: str(self.thread_percentage)}
        limits = {gpu.uuid: gpu.memory_limit_mib for gpu in self.gpus}
        memory = ",".join(
            f"{ordinal}={limits[target.uuid]}M"
            for ordinal, target in enumerate(targets)
            if limits.get(target.uuid, 0) > 0
        )
        if memory:
            env[MEMORY_ENV] = memory
        return env

    def client_mounts(self) -> dict[str, str]:
        """What a container mounts, container path to host path."""
        return {self.container_pipe_dir: self.pipe_dir, CONTAINER_SHM: self.shm_dir}

    @property
    def environment(self) -> Mapping[str, str]:
        """The daemon's own MPS variables (host paths)."""
        return {PIPE_ENV: self.pipe_dir, LOG_ENV: self.log_dir}

    @property
    def _base(self) -> str:
        return f"{self.mps_root.rstrip('/')}/{self.resource}"


def daemon_for(resource: str, targets: Iterable[Target], replicas: int, mps_root: str) -> MpsDaemon:
    """The daemon that shares the whole GPUs `targets` as `resource`, `replicas` clients
    each."""
    gpus = {
        target.gpu_index: MpsGpu(
            target.gpu_index, target.uuid, target.memory_bytes // replicas // MIB
        )
        for target in targets
    }
    return MpsDaemon(resource, replicas, tuple(gpus[i] for i in sorted(gpus)), mps_root)
