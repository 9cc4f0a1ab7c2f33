"""`SimNvml`: the `Nvml` protocol over simulated GPUs, for tests and `gpuop demo`.

`--nvml sim:<gpus>` gives each simulated node `gpus` H200s seeded from the recorded one
(`recordings.load_recording()`), with distinct identities, moving values (`sim_gpus.py`),
HGX wiring (`sim_topology.py`) and MIG (`sim_mig.py`). Tests and the simulated cluster
drive it: `inject_xid`, `inject_ecc`, `lose_gpu`, `enable_mig`, `start_process`.

MIG changes through `MigControl` as on a real node (`sim_mig`: placements, instance ids,
`InUse` while processes run); `require_reset_for_mig_mode`, `reset_gpu_mig` and
`fail_mig_call` let tests make a mode change wait for a reset or an NVML call fail. With
`mig_state` (`--nvml sim:` sets `<host root>/run/gpuop/sim-nvml/mig.json`) the MIG state
lives in that file, read before and written after every MIG call, so every service of a node
(each with its own session) sees what the driver-manager carved, as on a real node. With
`xid_feed` (`--nvml sim:` sets `<host root>/run/gpuop/sim-nvml/xids.jsonl`) the XIDs another
process puts there (`sim_xids.inject`: the demo's fault knob) reach this one's open watchers
too, within one of their waits; with `nvlink_feed` (`<host root>/run/gpuop/sim-nvml/nvlink.jsonl`)
the NVLink errors put there (`sim_xids.inject_nvlink_errors`) grow the counters the next
field query reads. With `mig_fault` (`--nvml sim:` sets
`<host root>/run/gpuop/sim-nvml/mig-fault`) a MIG call another process asked to fail there
(`sim_mig_fault.set_fault`) fails here, as `fail_mig_call` does within one process. With
`replaced` (`--nvml sim:` sets `<host root>/run/gpuop/sim-nvml/replaced.json`) a GPU another
process replaced there (`sim_replacements.replace_gpu`) has its new board's UUID and serial
from the next session on.

Driver coupling, through `modules.ModuleState`: `init()` raises `DriverNotLoaded` while the
`nvidia` module is not loaded; an open session holds the module as `holder_id` until
`shutdown()`, so the simulated kernel refuses to unload it meanwhile; the driver version is
the loaded module's. When a session opens on a different driver version than the last one
(or after an init found no driver), the GPUs go through a driver reload: volatile ECC
counters, energy and processes start again from zero. Without a module state the driver is
always loaded, at `driver_version`. The same happens to one GPU that the driver-manager reset
alone, or to every GPU after the module was loaded again, even at the same version: the
module state counts resets (`gpuop_sim.host.simreset`), and a session that opens after one
finds the GPU clean. MIG instances go with the driver, the mode stays: a session that
finds a driver load or a GPU reset counted since the instances were made finds them gone
(`sim_mig.SimMig.expire`), in the shared MIG file too, as a real node after a driver reload
or a reboot comes back with MIG on and no MIG device until its config is applied again.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.host.files import exclusive_lock, write_atomic
from gpuop.nvml.devices import DeviceInfo
from gpuop.nvml.errors import (
    DriverNotLoaded,
    GpuLost,
    InvalidArgument,
    NotFound,
    NotInitialized,
    NvmlError,
)
from gpuop.nvml.metrics import ClockEventReason, DeviceMetrics, FieldValue, PcieThroughput
from gpuop.nvml.mig import GpuInstance, MigDevice, MigModeState, MigProfile, Placement
from gpuop.nvml.profiling import Activity
from gpuop.nvml.recordings import load_recording
from gpuop.nvml.topology import NvLink, PeerTopology
from gpuop.nvml.watching import (
    DeviceEvent,
    EccEvent,
    EventWatcher,
    QueueWatcher,
    WatcherSet,
    XidEvent,
)
from gpuop_sim import recordings
from gpuop_sim.nvml import (
    sim_fields,
    sim_mig,
    sim_mig_fault,
    sim_replacements,
    sim_topology,
    sim_xids,
)
from gpuop_sim.nvml.modules import DRIVER_RESETS, NVIDIA, ModuleState, reset_key
from gpuop_sim.nvml.sim_fields import field_value, pcie_throughput
from gpuop_sim.nvml.sim_gpus import SimGpu, gpu_uuid, identity, serial_number

MAX_GPUS = 64
"""The most GPUs one node's inventory can carry (`hardware.Gpu.index` is at most 63)."""
CUDA_BY_DRIVER_BRANCH = {
    525: "12.0", 530: "12.1", 535: "12.2", 545: "12.3", 550: "12.4", 555: "12.5",
    560: "12.6", 565: "12.7", 570: "12.8", 575: "12.9", 580: "13.0", 590: "13.1",
}  # fmt: skip
"""Highest CUDA version each driver branch supports; other branches report the recording's."""
SLOW_QUERY_SECONDS = {"pcie": 0.021, "fields": 0.0034}
"""What the two slow queries cost on the recorded H200, slept when `simulate_latency`."""
_holder_ids = itertools.count()


class SimNvml:
    """Simulated NVML for one node of `gpus` H200s.

    `node` fixes the GPUs' identities, `seed` (with `node`) their random walks, `clock`
    (its monotonic seconds) their pace. `module_state` couples the session to a kernel, holding
    `nvidia` as `holder_id`; `driver_version` is reported when no module state says.
    `recording` replaces the recorded H200's `nvml.json` (`gpuop_sim.recordings`);
    `simulate_latency` makes the two slow queries sleep as long as they take on a real H200.
    """

    def __init__(
        self,
        gpus: int = 8,
        *,
        node: str = "sim-node",
        seed: int = 0,
        module_state: ModuleState | None = None,
        holder_id: str | None = None,
        driver_version: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        recording: Path | None = None,
        simulate_latency: bool = False,
        mig_state: Path | None = None,
        xid_feed: Path | None = None,
        nvlink_feed: Path | None = None,
        mig_fault: Path | None = None,
        replaced: Path | None = None,
    ) -> None:
        if not 1 <= gpus <= MAX_GPUS:
            raise ValueError(f"a simulated node has 1 to {MAX_GPUS} GPUs, not {gpus}")
        self.node = node
        self.holder_id = holder_id or f"nvml-{os.getpid()}-{next(_holder_ids)}"
        """Who the open session holds the `nvidia` module as."""
        self._recording = load_recording(recording or recordings.H200_NVML)
        self._modules = module_state
        self._configured_version = driver_version or self._recording.driver_version
        self._clock = clock
        self._latency = simulate_latency
        template = self._recording.devices[0]
        now = clock.monotonic()
        self._gpus = [
            SimGpu(
                identity(template.info, node, index, gpus),
                template.metrics,
                random.Random(f"{seed}/{node}/{index}"),
                now,
            )
            for index in range(gpus)
        ]
        self._mig = [sim_mig.SimMig() for _ in range(gpus)]
        self._mig_state = mig_state
        self._mig_failures: dict[str, list[NvmlError | None]] = {}
        self._mig_fault = mig_fault
        self._replaced = replaced
        self._boards: dict[int, int] = {}
        """GPU index -> the board in its slot, as the last session found it."""
        self._lost: set[int] = set()
        self._watchers: WatcherSet[QueueWatcher] = WatcherSet()
        self._xid_feed = sim_xids.XidFeed(xid_feed) if xid_feed is not None else None
        self._nvlink_feed = sim_xids.NvlinkFeed(nvlink_feed) if nvlink_feed else None
        self._lock = threading.RLock()
        self._session_version: str | None = None
        self._last_version: str | None = None
        self._unloaded_seen = False
        self._resets_seen = self._reset_counts()
        self._gpm_sampled: set[tuple[int, int | None]] = set()
        """The GPUs and GPU instances `activity()` sampled in this session."""

    # The session and the driver behind it.

    def init(self) -> None:
        with self._lock:
            if self._session_version is not None:
                return
            version = self._configured_version
            if self._modules is not None:
                try:
                    self._modules.hold(NVIDIA, self.holder_id)
                except DriverNotLoaded:
                    self._unloaded_seen = True
                    raise
                version = self._modules.version(NVIDIA) or version
            if self._unloaded_seen or self._last_version not in (None, version):
                self._reload_driver()
            self._apply_resets()
            self._take_replacements()
            self._unloaded_seen = False
            self._session_version = self._last_version = version

    def shutdown(self) -> None:
        self._watchers.close_all()
        with self._lock:
            if self._session_version is None:
                return
            self._session_version = None
            self._gpm_sampled.clear()
            if self._modules is not None:
                self._modules.release(NVIDIA, self.holder_id)

    def set_driver_version(self, version: str) -> None:
        """The version reported from the next session on, when no module state says."""
        self._configured_version = version

    def driver_version(self) -> str:
        return self._session()

    def cuda_driver_version(self) -> str:
        branch = self._session().split(".", 1)[0]
        default = self._recording.cuda_driver_version
        return CUDA_BY_DRIVER_BRANCH.get(int(branch), default) if branch.isdigit() else default

    def nvml_version(self) -> str:
        return f"{self.cuda_driver_version().split('.')[0]}.{self._session()}"

    def device_count(self) -> int:
        self._session()
        if self._modules is not None and not self._modules.brings_up_gpus(NVIDIA):
            return 0  # a defective driver build: loaded, but no GPU came up
        return len(self._gpus)

    # Queries.

    def device_info(self, index: int) -> DeviceInfo:
        with self._lock:
            gpu = self._gpu(index)
            mode = self._load_mig()[index].mode
            if not (mode.current or mode.pending):
                return gpu.info
            return dataclasses.replace(
                gpu.info,
                mig_mode_current=mode.current,
                mig_mode_pending=mode.pending,
                max_mig_devices=7 if mode.current else gpu.info.max_mig_devices,
            )

    def metrics(self, index: int) -> DeviceMetrics:
        with self._lock:
            gpu = self._gpu(index)
            gpu.advance(self._clock.monotonic())
            return gpu.metrics()

    def pcie_throughput(self, index: int) -> PcieThroughput:
        with self._lock:
            gpu = self._gpu(index)
            gpu.advance(self._clock.monotonic())
            answer = pcie_throughput(gpu)
        self._slow("pcie")
        return answer

    def field_values(self, index: int, field_ids: Sequence[int]) -> tuple[FieldValue, ...]:
        for uuid, counts in self._nvlink_feed.take() if self._nvlink_feed else ():
            if (fed := self._index_of(uuid)) is not None:
                self.inject_nvlink_errors(fed, counts)
        with self._lock:
            gpu = self._gpu(index)
            gpu.advance(self._clock.monotonic())
            nvlink = sim_topology.has_nvlink(len(self._gpus))
            answer = tuple(field_value(gpu, int(f), nvlink=nvlink) for f in field_ids)
        self._slow("fields")
        return answer

    def activity(self, index: int, gpu_instance_id: int | None = None) -> Activity:
        with self._lock:
            gpu = self._gpu(index)
            gpu.advance(self._clock.monotonic())
            share = 1.0
            if gpu_instance_id is not None:
                share = self._mig_share(index, gpu_instance_id)
            first = (index, gpu_instance_id) not in self._gpm_sampled
            self._gpm_sampled.add((index, gpu_instance_id))
            nvlink = sim_topology.has_nvlink(len(self._gpus))
        if first:  # GPM's first sample: no interval yet
            return Activity(index, gpu_instance_id)
        return sim_fields.activity(gpu, gpu_instance_id, share, nvlink=nvlink)

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        with self._lock:
            self._gpu(index)
            return sim_topology.nvlinks(index, len(self._gpus))

    def topology(self, index: int, peer: int) -> PeerTopology:
        with self._lock:
            self._gpu(index)
            self._gpu(peer)
            return sim_topology.topology(index, peer, len(self._gpus))

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        with self._lock:
            return sim_mig.h200_profiles(self._gpu(index).info.memory_total_bytes)

    def mig_devices(self, index: int) -> tuple[MigDevice, ...]:
        with self._lock:
            info = self._gpu(index).info
            return self._load_mig()[index].devices(index, info.uuid, info.memory_total_bytes)

    # MigControl.

    def mig_mode(self, index: int) -> MigModeState:
        with self._lock:
            self._gpu(index)
            return self._load_mig()[index].mode

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeState:
        with self._lock:
            gpu = self._gpu(index)
            self._maybe_fail("set_mig_mode")
            with self._changing_mig() as mig:
                return mig[index].set_mode(enabled, busy=bool(gpu.counters.processes))

    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]:
        with self._lock:
            self._gpu(index)
            return self._load_mig()[index].gpu_instances()

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int:
        with self._lock:
            self._gpu(index)
            self._maybe_fail("create_gpu_instance")
            with self._changing_mig() as mig:
                return mig[index].create_gpu_instance(profile_id, placement)

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        with self._lock:
            self._gpu(index)
            self._maybe_fail("destroy_gpu_instance")
            with self._changing_mig() as mig:
                mig[index].destroy_gpu_instance(gpu_instance_id)

    def create_compute_instance(self, index: int, gpu_instance_id: int) -> int:
        with self._lock:
            self._gpu(index)
            self._maybe_fail("create_compute_instance")
            with self._changing_mig() as mig:
                return mig[index].create_compute_instance(gpu_instance_id)

    def destroy_compute_instance(
        self, index: int, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        with self._lock:
            self._gpu(index)
            self._maybe_fail("destroy_compute_instance")
            with self._changing_mig() as mig:
                mig[index].destroy_compute_instance(gpu_instance_id, compute_instance_id)

    def watch_events(self, indices: Sequence[int] | None = None) -> EventWatcher:
        with self._lock:
            self._session()
            chosen = range(len(self._gpus)) if indices is None else indices
            for index in chosen:
                self._gpu(index)
            if self._xid_feed is None:
                watcher = QueueWatcher(chosen, on_close=self._watchers.discard)
            else:
                watcher = _FeedWatcher(chosen, self._watchers.discard, self._take_fed_xids)
            return self._watchers.add(watcher)

    # What tests and the simulated cluster do to the GPUs; none needs an open session.

    def inject_xid(
        self,
        index: int,
        xid: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """The driver reports XID `xid` on the GPU; open watchers receive it."""
        uuid = self._info(index).uuid
        self._publish(XidEvent(index, uuid, xid, gpu_instance_id, compute_instance_id))

    def inject_ecc(
        self, index: int, *, volatile_corrected: int = 0, volatile_uncorrected: int = 0
    ) -> None:
        """The GPU counts ECC errors: the volatile and aggregate counters grow, uncorrected
        ones remap rows (pending until the next reset), and watchers get one event per kind."""
        if volatile_corrected < 0 or volatile_uncorrected < 0:
            raise ValueError("ECC error counts cannot be negative")
        with self._lock:
            gpu = self._gpus[self._index(index)]
            c = gpu.counters
            c.volatile_corrected += volatile_corrected
            c.aggregate_corrected += volatile_corrected
            c.volatile_uncorrected += volatile_uncorrected
            c.aggregate_uncorrected += volatile_uncorrected
            if volatile_uncorrected:
                c.remapped_uncorrectable += volatile_uncorrected
                c.remap_pending = True
        if volatile_corrected:
            self._publish(EccEvent(index, gpu.info.uuid, uncorrectable=False))
        if volatile_uncorrected:
            self._publish(EccEvent(index, gpu.info.uuid, uncorrectable=True))

    def inject_nvlink_errors(self, index: int, counts: Mapping[int, int]) -> None:
        """The GPU's NVLink error totals grow by `counts` (by `FieldId`: CRC flit, CRC
        data, replay, recovery), as a link failing its CRC checks makes them grow."""
        if any(count < 0 for count in counts.values()):
            raise ValueError("NVLink error counts cannot be negative")
        with self._lock:
            totals = self._gpus[self._index(index)].counters.nvlink_errors
            for field_id, count in counts.items():
                totals[field_id] = totals.get(field_id, 0) + count

    def degrade_pcie_link(self, index: int, link: tuple[int, int] | None) -> None:
        """The GPU's PCIe link runs at (generation, width) below its maximum; None: at its
        maximum again."""
        with self._lock:
            self._gpus[self._index(index)].counters.pcie_link = link

    def hold_clocks(self, index: int, reasons: ClockEventReason) -> None:
        """Clock event reasons put on the GPU from outside (NONE lifts them)."""
        with self._lock:
            self._gpus[self._index(index)].counters.clock_events = reasons

    def fail_row_remap(self, index: int) -> None:
        """The GPU runs out of spare rows: its remapper reports a failure from now on."""
        with self._lock:
            self._gpus[self._index(index)].counters.remap_failure = True

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus: XID 79 to watchers, then every query of it raises
        `GpuLost` until `recover_gpu()` or a driver reload."""
        with self._lock:
            self._lost.add(self._index(index))
        self.inject_xid(index, 79)

    def recover_gpu(self, index: int) -> None:
        """The GPU answers again."""
        with self._lock:
            self._lost.discard(self._index(index))

    def enable_mig(self, index: int, profiles: Sequence[str]) -> None:
        """Turn MIG on with one MIG device per profile, such as `["3g.71gb", "4g.71gb"]`;
        `ValueError` when the layout does not fit an H200."""
        with self._lock:
            info = self._gpus[self._index(index)].info
            carved = sim_mig.SimMig()
            sim_mig.carve(carved, info.memory_total_bytes, profiles)
            with self._changing_mig() as mig:
                mig[index] = carved

    def disable_mig(self, index: int) -> None:
        """Turn MIG off: the whole GPU is one device again."""
        with self._lock, self._changing_mig() as mig:
            mig[self._index(index)] = sim_mig.SimMig()

    def require_reset_for_mig_mode(self, index: int, required: bool = True) -> None:
        """MIG mode changes on the GPU stay pending until `reset_gpu_mig`."""
        with self._lock, self._changing_mig() as mig:
            mig[self._index(index)].reset_required = required

    def reset_gpu_mig(self, index: int) -> None:
        """The GPU is reset: a pending MIG mode takes effect, its instances are gone."""
        with self._lock, self._changing_mig() as mig:
            mig[self._index(index)].reset()

    def fail_mig_call(self, call: str, error: NvmlError, *, after: int = 0) -> None:
        """The MIG call `call` (`create_gpu_instance`, ...) succeeds `after` more times,
        then raises `error` once."""
        with self._lock:
            self._mig_failures.setdefault(call, []).extend([*([None] * after), error])

    def start_process(self, index: int, pid: int, used_memory_bytes: int) -> None:
        """A compute process with `used_memory_bytes` of framebuffer starts on the GPU."""
        with self._lock:
            self._gpus[self._index(index)].counters.processes[pid] = used_memory_bytes

    def end_process(self, index: int, pid: int) -> None:
        """The process exits."""
        with self._lock:
            self._gpus[self._index(index)].counters.processes.pop(pid, None)

    # Internals.

    def _session(self) -> str:
        version = self._session_version
        if version is None:
            raise NotInitialized("the NVML session is not open: call init() first")
        return version

    def _index(self, index: int) -> int:
        if not 0 <= index < len(self._gpus):
            raise InvalidArgument(f"no GPU at index {index}: the node has {len(self._gpus)}")
        return index

    def _info(self, index: int) -> DeviceInfo:
        with self._lock:
            return self._gpus[self._index(index)].info

    def _mig_share(self, index: int, gpu_instance_id: int) -> float:
        """The share of GPU `index`'s slices its GPU instance holds."""
        info = self._gpu(index).info
        for device in self._load_mig()[index].devices(index, info.uuid, info.memory_total_bytes):
            if device.gpu_instance_id == gpu_instance_id:
                return device.gpu_instance_slices / sim_mig.COMPUTE_SLICES
        raise NotFound(f"GPU {index} has no GPU instance {gpu_instance_id}")

    def _gpu(self, index: int) -> SimGpu:
        self._session()
        if self._index(index) in self._lost:
            raise GpuLost(f"GPU {index} has fallen off the bus")
        return self._gpus[index]

    def _load_mig(self) -> list[sim_mig.SimMig]:
        """The MIG state, read again from the shared file when there is one, without the
        instances an unload, reboot or reset since took away (written back under the file's
        lock, read again there: another session may have carved anew meanwhile)."""
        self._read_mig()
        if self._expire_mig(self._mig) and self._shared():
            with self._mig_locked():
                self._read_mig()
                if self._expire_mig(self._mig):
                    self._write_mig(self._mig)
        return self._mig

    def _shared(self) -> bool:
        return self._mig_state is not None and self._mig_state.exists()

    def _read_mig(self) -> None:
        path = self._mig_state
        if path is None or not path.exists():
            return
        gpus = json.loads(path.read_text())
        self._mig = [sim_mig.SimMig.from_json(gpu) for gpu in gpus[: len(self._gpus)]]
        self._mig += [sim_mig.SimMig() for _ in range(len(self._gpus) - len(self._mig))]

    def _write_mig(self, mig: list[sim_mig.SimMig]) -> None:
        if self._mig_state is not None:
            write_atomic(self._mig_state, json.dumps([m.to_json() for m in mig]).encode())

    @contextmanager
    def _mig_locked(self) -> Iterator[None]:
        """The shared file's lock (`<file>.lock`), held from a read to its write back, so two
        sessions' changes never overwrite each other; nothing without a shared file."""
        if self._mig_state is None:
            yield
            return
        with exclusive_lock(self._mig_state.with_name(self._mig_state.name + ".lock")):
            yield

    def _expire_mig(self, mig: list[sim_mig.SimMig]) -> bool:
        """Each GPU's MIG state caught up with the reset counts; whether any changed. Without
        a module state nothing reloads the driver and the state keeps no epoch."""
        if self._modules is None:
            return False
        counts = self._modules.reset_counts()
        loads = counts.get(DRIVER_RESETS, 0)
        changed = False
        for gpu, state in zip(self._gpus, mig, strict=True):
            epoch = (loads, counts.get(reset_key(gpu.info.pci_bus_id), 0))
            changed = state.expire(epoch) or changed
        return changed

    @contextmanager
    def _changing_mig(self) -> Iterator[list[sim_mig.SimMig]]:
        """The MIG state to change, under the shared file's lock, written back after (also
        after a refused call: NVML's refusals change nothing, so the file is as read)."""
        with self._mig_locked():
            self._read_mig()
            mig = self._mig
            self._expire_mig(mig)
            try:
                yield mig
            finally:
                self._expire_mig(mig)  # a GPU carved anew here is of the driver running now
                self._write_mig(mig)

    def _maybe_fail(self, call: str) -> None:
        queued = self._mig_failures.get(call)
        if queued:
            error = queued.pop(0)
            if error is not None:
                raise error
        if self._mig_fault is not None:
            fault = sim_mig_fault.take(self._mig_fault, call)
            if fault is not None:
                raise fault

    def _reload_driver(self) -> None:
        now = self._clock.monotonic()
        for gpu in self._gpus:
            gpu.advance(now)
            gpu.driver_reloaded()
        self._lost.clear()

    def _reset_counts(self) -> dict[str, int]:
        return dict(self._modules.reset_counts()) if self._modules is not None else {}

    def _apply_resets(self) -> None:
        """Clear what the resets counted since the last session cleared."""
        counts = self._reset_counts()
        seen, self._resets_seen = self._resets_seen, counts
        if counts.get(DRIVER_RESETS) != seen.get(DRIVER_RESETS):
            self._reload_driver()
            return
        now = self._clock.monotonic()
        for index, gpu in enumerate(self._gpus):
            key = reset_key(gpu.info.pci_bus_id)
            if counts.get(key) != seen.get(key):
                gpu.advance(now)
                gpu.driver_reloaded()
                self._lost.discard(index)

    def _take_replacements(self) -> None:
        """Each GPU whose slot got a new board since the last session has that board's
        identity (same index and PCI address, another UUID and serial), clean."""
        if self._replaced is None:
            return
        counted = sim_replacements.boards(self._replaced)
        for index, gpu in enumerate(self._gpus):
            board = counted.get(index, 0)
            if board != self._boards.get(index, 0):
                gpu.info = dataclasses.replace(
                    gpu.info,
                    uuid=gpu_uuid(self.node, index, board),
                    serial=serial_number(self.node, index, board),
                )
                gpu.driver_reloaded()
                self._lost.discard(index)
        self._boards = counted

    def _take_fed_xids(self) -> None:
        """Deliver the XIDs another process put in the feed since the last look."""
        assert self._xid_feed is not None
        for uuid, xid in self._xid_feed.take():
            if (index := self._index_of(uuid)) is not None:
                self.inject_xid(index, xid)

    def _index_of(self, uuid: str) -> int | None:
        """The index of the GPU with `uuid`; None when this node has none."""
        return next((i for i, g in enumerate(self._gpus) if g.info.uuid == uuid), None)

    def _publish(self, event: DeviceEvent) -> None:
        for watcher in self._watchers.snapshot():
            watcher.deliver(event)

    def _slow(self, query: str) -> None:
        if self._latency:
            time.sleep(SLOW_QUERY_SECONDS[query])


class _FeedWatcher(QueueWatcher):
    """A watcher that, before each wait, takes in what the node's XID feed got since."""

    def __init__(
        self,
        indices: Collection[int],
        on_close: Callable[[QueueWatcher], None],
        take_fed: Callable[[], None],
    ) -> None:
        super().__init__(indices, on_close=on_close)
        self._take_fed = take_fed

    def wait(self, timeout_ms: int) -> DeviceEvent | None:
        self._take_fed()
        return super().wait(timeout_ms)
