"""The driver-manager's MIG step (`ApplyMigLayout`) on the simulated node: the layout carved,
read back and named in the CDI spec; GPUs already right untouched; busy GPUs refused before
anything changes; a failure part way restored and the spec written for the restored layout; a
backend that cannot change MIG refused."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpuop.clocks import VirtualClock
from gpuop.events import mig_commands
from gpuop.host import cdi
from gpuop.host.roots import HostRoot
from gpuop.nvml import RecordedNvml, errors
from gpuop.services.driver_manager.cdi import SpecWriter
from gpuop.services.driver_manager.mig import MigApplier
from gpuop_sim import recordings
from gpuop_sim.nvml.backend import MIG_STATE
from gpuop_sim.nvml.simulated import SimNvml
from tests.support import cdi as support
from tests.support.driver_manager import KERNEL, OLD, Harness

BALANCED = mig_commands.GpuMigLayout(
    gpu_index=0,
    mig_enabled=True,
    devices=(
        mig_commands.MigDeviceCount(profile="1g.18gb", count=2),
        mig_commands.MigDeviceCount(profile="2g.35gb", count=1),
        mig_commands.MigDeviceCount(profile="3g.71gb", count=1),
    ),
)
SEVEN = mig_commands.GpuMigLayout(
    gpu_index=1,
    mig_enabled=True,
    devices=(mig_commands.MigDeviceCount(profile="1g.18gb", count=7),),
)
TOO_MUCH = mig_commands.GpuMigLayout(
    gpu_index=0,
    mig_enabled=True,
    devices=(
        mig_commands.MigDeviceCount(profile="4g.71gb", count=1),
        mig_commands.MigDeviceCount(profile="3g.71gb", count=1),
        mig_commands.MigDeviceCount(profile="1g.18gb", count=1),
    ),
)
Reason = mig_commands.MigFailureReason


def command(*layouts: mig_commands.GpuMigLayout) -> mig_commands.ApplyMigLayout:
    return mig_commands.ApplyMigLayout(config="test-layout", layouts=layouts, timeout_seconds=5)


def spec_names(host: HostRoot) -> list[str]:
    spec = json.loads(cdi.spec_path(host).read_bytes())
    return [device["name"] for device in spec["devices"]]


@pytest.fixture
def sim(host: HostRoot) -> Iterator[SimNvml]:
    nvml = SimNvml(8, node="gpu-node-1", recording=recordings.H200_NVML)
    nvml.init()
    yield nvml
    nvml.shutdown()


def applier(host: HostRoot, nvml: object) -> MigApplier:
    specs = SpecWriter(host, lambda: nvml, VirtualClock())  # type: ignore[arg-type,return-value]
    return MigApplier(lambda: nvml, specs, lambda: OLD)  # type: ignore[arg-type,return-value]


async def test_a_layout_is_carved_and_named_in_the_cdi_spec(
    harness: Harness, host: HostRoot
) -> None:
    support.install_userspace(host, support.manifest(OLD, KERNEL))
    answer = await harness.send(command(BALANCED, SEVEN))
    assert isinstance(answer, mig_commands.MigLayoutApplied), answer
    assert (answer.config, answer.changed_gpus, answer.mig_devices) == ("test-layout", (0, 1), 11)
    names = spec_names(host)
    assert {"0:0", "0:3", "1:6"} <= set(names)
    assert sum(name.startswith("MIG-") for name in names) == 11
    assert host.join(MIG_STATE).exists()  # what the node's other services read

    again = await harness.send(command(BALANCED))
    assert isinstance(again, mig_commands.MigLayoutApplied)
    assert again.changed_gpus == ()


async def test_a_layout_that_does_not_fit_changes_nothing(harness: Harness, host: HostRoot) -> None:
    answer = await harness.send(command(TOO_MUCH))
    assert isinstance(answer, mig_commands.MigLayoutFailed)
    assert (answer.reason, answer.restored) == (Reason.INVALID_LAYOUT, True)
    assert "do not fit together" in answer.message
    twice = await harness.send(command(BALANCED, BALANCED))
    assert isinstance(twice, mig_commands.MigLayoutFailed)
    assert twice.reason is Reason.INVALID_LAYOUT and "two layouts" in twice.message


async def test_busy_gpus_to_re_carve_are_refused_before_anything_changes(
    host: HostRoot, sim: SimNvml
) -> None:
    sim.start_process(0, 4242, 2**30)
    sim.start_process(5, 77, 2**30)  # not re-carved: no matter
    answer = await applier(host, sim).apply("cmd-1", command(BALANCED, SEVEN))
    assert isinstance(answer, mig_commands.MigLayoutFailed)
    assert (answer.reason, answer.restored) == (Reason.IN_USE, True)
    assert "GPU 0 (pid 4242)" in answer.message and "GPU 5" not in answer.message
    sim.init()  # the step closed its session
    assert sim.mig_devices(0) == sim.mig_devices(1) == ()


def hold_gpu(root: HostRoot, pid: int, minor: int, name: str) -> None:
    """A host process with `/dev/nvidia<minor>` open."""
    fd = root.join(f"proc/{pid}/fd")
    fd.mkdir(parents=True, exist_ok=True)
    (fd / "4").symlink_to(f"/dev/nvidia{minor}")
    root.join(f"proc/{pid}/comm").write_text(f"{name}\n")


async def test_a_process_holding_the_device_file_of_a_gpu_to_re_carve_refuses(
    harness: Harness, host: HostRoot
) -> None:
    hold_gpu(host, 5150, 1, "dcgm-exporter")
    hold_gpu(host, 5151, 0, "nvidia-persistenced")  # keeps the files open, runs nothing
    answer = await harness.send(command(BALANCED, SEVEN))
    assert isinstance(answer, mig_commands.MigLayoutFailed)
    assert (answer.reason, answer.restored) == (Reason.IN_USE, True)
    assert answer.message.endswith("GPU 1 (dcgm-exporter[5150])")
    assert not host.join(MIG_STATE).exists()  # nothing was changed


async def test_a_failure_part_way_restores_the_layout_and_its_spec(
    host: HostRoot, sim: SimNvml
) -> None:
    support.install_userspace(host, support.manifest(OLD, KERNEL))
    sim.enable_mig(0, ["7g.141gb"])
    before = sim.mig_devices(0), sim.mig_devices(1)
    sim.fail_mig_call("create_compute_instance", errors.NvmlError("injected"), after=5)
    answer = await applier(host, sim).apply("cmd-2", command(BALANCED, SEVEN))
    assert isinstance(answer, mig_commands.MigLayoutFailed)
    assert (answer.reason, answer.restored) == (Reason.APPLY_FAILED, True)
    assert "injected; the layout before is back" in answer.message
    sim.init()
    assert (sim.mig_devices(0), sim.mig_devices(1)) == before
    (whole,) = before[0]
    assert whole.uuid in spec_names(host) and "0:0" in spec_names(host)


async def test_a_mode_change_waiting_for_a_reset_is_pending(host: HostRoot, sim: SimNvml) -> None:
    sim.require_reset_for_mig_mode(0)
    answer = await applier(host, sim).apply("cmd-3", command(BALANCED))
    assert isinstance(answer, mig_commands.MigLayoutFailed)
    assert (answer.reason, answer.restored) == (Reason.MODE_PENDING, False)


async def test_a_backend_that_cannot_change_mig_is_refused(host: HostRoot) -> None:
    recorded = RecordedNvml(recordings.H200_NVML)
    answer = await applier(host, recorded).apply("cmd-4", command(BALANCED))
    assert isinstance(answer, mig_commands.MigLayoutFailed)
    assert (answer.reason, answer.restored) == (Reason.NOT_SUPPORTED, True)
