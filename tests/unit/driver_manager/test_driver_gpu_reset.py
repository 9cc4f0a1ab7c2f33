"""`ResetGpu` on a simulated H200 node: each outcome of the driver-manager's GPU reset, through
the agent on the bus (the executor's registration), and the reset's effect on the simulated
NVML that telemetry reads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pydantic
import pytest

from gpuop.clocks import VirtualClock
from gpuop.events import remediation_commands
from gpuop.host import modules
from gpuop.host.resets import FunctionResetFailed, SysfsFunctionResets, reset_file, sysfs_address
from gpuop.host.roots import HostRoot
from gpuop.nvml import DeviceInfo, opened
from gpuop.services.driver_manager.reloading import Reloader
from gpuop.services.driver_manager.resetting import GpuResetter
from gpuop_sim.host import simreset
from gpuop_sim.host.simkernel import SimKernel
from gpuop_sim.nvml.modules import HostRootModules
from gpuop_sim.nvml.sim_gpus import bus_id, gpu_uuid
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.driver_manager import NODE, OLD, Harness

GPUS = 8
Reason = remediation_commands.ResetFailureReason
Method = remediation_commands.ResetMethod


def uuid(index: int) -> str:
    return gpu_uuid(NODE, index)


def resets_of(root: HostRoot, index: int) -> int:
    return simreset.reset_counts(root.path).get(simreset.count_key(bus_id(index, GPUS)), 0)


def driver_loads(root: HostRoot) -> int:
    return simreset.reset_counts(root.path).get(simreset.DRIVER, 0)


def hold_gpu(root: HostRoot, pid: int, minor: int | None, name: str = "python") -> None:
    """A process of the host with `/dev/nvidia<minor>` open (None: only `nvidiactl`)."""
    fd = root.join(f"proc/{pid}/fd")
    fd.mkdir(parents=True, exist_ok=True)
    (fd / "3").symlink_to("/dev/nvidiactl")
    if minor is not None:
        (fd / "4").symlink_to(f"/dev/nvidia{minor}")
    root.join(f"proc/{pid}/comm").write_text(f"{name}\n")


def reset_gpu(
    *indices: int, reload: bool = False, timeout: int = 60
) -> remediation_commands.ResetGpu:
    return remediation_commands.ResetGpu(
        gpu_uuids=tuple(uuid(i) for i in indices),
        allow_driver_reload=reload,
        timeout_seconds=timeout,
    )


async def test_a_free_gpu_is_reset_alone_and_only_it(harness: Harness) -> None:
    answer = await harness.send(reset_gpu(3))

    assert isinstance(answer, remediation_commands.GpuReset)
    assert answer.method is Method.NVML
    assert answer.gpu_uuids == (uuid(3),)
    assert [resets_of(harness.root, i) for i in range(GPUS)] == [0, 0, 0, 1, 0, 0, 0, 0]
    assert harness.counted("reset-gpu", "executed") == 1


async def test_the_reset_clears_the_gpus_errors_for_the_next_nvml_session(
    harness: Harness,
) -> None:
    telemetry = SimNvml(GPUS, node=NODE, module_state=HostRootModules(harness.root.path))
    with opened(telemetry):
        telemetry.inject_ecc(3, volatile_uncorrected=2)
        telemetry.inject_ecc(4, volatile_uncorrected=1)
    # telemetry paused: its session is closed while the driver-manager resets

    answer = await harness.send(reset_gpu(3))

    assert isinstance(answer, remediation_commands.GpuReset)
    with opened(telemetry):
        reset, untouched = telemetry.metrics(3), telemetry.metrics(4)
    assert (reset.ecc_volatile_uncorrected, reset.remapped_rows_pending) == (0, False)
    assert reset.ecc_aggregate_uncorrected == 2  # the lifetime count stays
    assert (untouched.ecc_volatile_uncorrected, untouched.remapped_rows_pending) == (1, True)


async def test_a_gpu_a_process_holds_is_refused_in_use_naming_it(harness: Harness) -> None:
    hold_gpu(harness.root, 4242, minor=2)

    answer = await harness.send(reset_gpu(2, 5, reload=True))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.IN_USE
    assert f"{uuid(2)}: python[4242]" in answer.message
    assert resets_of(harness.root, 2) == resets_of(harness.root, 5) == 0


async def test_processes_on_other_gpus_do_not_keep_a_gpu_from_its_reset(
    harness: Harness,
) -> None:
    hold_gpu(harness.root, 4242, minor=0)
    hold_gpu(harness.root, 4243, minor=None, name="dcgm")

    answer = await harness.send(reset_gpu(2))

    assert isinstance(answer, remediation_commands.GpuReset)
    assert answer.method is Method.NVML


async def test_no_function_reset_without_a_driver_reload_is_not_supported(
    harness: Harness,
) -> None:
    simreset.set_fault(harness.root, simreset.UNSUPPORTED)

    answer = await harness.send(reset_gpu(1))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.NOT_SUPPORTED
    assert "offers no function reset" in answer.message
    assert "not allowed" in answer.message
    assert driver_loads(harness.root) == 1  # the seeding's boot only


async def test_no_function_reset_with_a_driver_reload_reloads_the_running_driver(
    harness: Harness,
) -> None:
    simreset.set_fault(harness.root, simreset.UNSUPPORTED)
    before = modules.loaded_modules(harness.root)

    answer = await harness.send(reset_gpu(1, reload=True))

    assert isinstance(answer, remediation_commands.GpuReset)
    assert answer.method is Method.DRIVER_RELOAD
    assert driver_loads(harness.root) == 2
    assert modules.module_version(harness.root, "nvidia") == OLD
    assert {m.name for m in modules.loaded_modules(harness.root)} == {m.name for m in before}


async def test_a_driver_reload_is_refused_while_any_gpu_is_in_use(harness: Harness) -> None:
    simreset.set_fault(harness.root, simreset.UNSUPPORTED)
    hold_gpu(harness.root, 777, minor=6, name="trainer")

    answer = await harness.send(reset_gpu(1, reload=True))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.IN_USE
    assert "a driver reload resets every GPU" in answer.message
    assert "trainer[777]" in answer.message
    assert driver_loads(harness.root) == 1
    assert modules.module_version(harness.root, "nvidia") == OLD


async def test_a_driver_reload_an_nvml_session_holds_up_is_in_use_and_keeps_the_driver(
    harness: Harness,
) -> None:
    simreset.set_fault(harness.root, simreset.UNSUPPORTED)
    operand = SimNvml(GPUS, node=NODE, module_state=HostRootModules(harness.root.path))
    operand.init()  # an operand the saga did not pause
    try:
        answer = await harness.send(reset_gpu(1, reload=True, timeout=5))
    finally:
        operand.shutdown()

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.IN_USE
    assert "did not unload" in answer.message
    assert modules.module_version(harness.root, "nvidia") == OLD


async def test_a_failed_reset_is_reset_failed_without_a_reload_and_reloads_with_one(
    harness: Harness,
) -> None:
    simreset.set_fault(harness.root, simreset.FAIL)

    refused = await harness.send(reset_gpu(0))
    reloaded = await harness.send(reset_gpu(0, reload=True))

    assert isinstance(refused, remediation_commands.GpuResetFailed)
    assert refused.reason is Reason.RESET_FAILED
    assert "Input/output error" in refused.message
    assert isinstance(reloaded, remediation_commands.GpuReset)
    assert reloaded.method is Method.DRIVER_RELOAD


async def test_a_reset_that_hangs_answers_timeout(harness: Harness) -> None:
    simreset.set_fault(harness.root, simreset.HANG)

    answer = await harness.send(reset_gpu(0, reload=True, timeout=1), timeout=10)

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.TIMEOUT
    assert "within 1 s" in answer.message
    assert driver_loads(harness.root) == 1  # a timeout does not go on to reload


async def test_a_gpu_of_another_node_is_not_supported(harness: Harness) -> None:
    stranger = gpu_uuid("another-node", 0)

    answer = await harness.send(remediation_commands.ResetGpu(gpu_uuids=(uuid(0), stranger)))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.NOT_SUPPORTED
    assert stranger in answer.message
    assert resets_of(harness.root, 0) == 0


async def test_a_redelivered_reset_answers_again_without_resetting_again(
    harness: Harness,
) -> None:
    envelope = harness.command(reset_gpu(3))
    await harness.bus.publish(envelope)
    await harness.result(envelope.id)
    # the same command again, past the bus's duplicate window (another Nats-Msg-Id)
    subject = f"gpuop.cmd.driver-manager.{NODE}.{remediation_commands.ResetGpu.VERB}"
    await harness.bus.publish_raw(subject, envelope.to_bytes(), {"Nats-Msg-Id": "redelivered"})
    await harness.wait_counted("reset-gpu", "replayed", 1)

    assert resets_of(harness.root, 3) == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"gpu_uuids": ()},
        {"gpu_uuids": ("GPU-not-a-uuid",)},
        {"gpu_uuids": (gpu_uuid(NODE, 0),), "timeout_seconds": 0},
        {"gpu_uuids": (gpu_uuid(NODE, 0),), "allow_driver_reload": "maybe"},
    ],
)
def test_a_malformed_reset_command_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        remediation_commands.ResetGpu.model_validate(fields, strict=False)


# the rule for NVLink peers, on GPUs older than Ampere


class VoltaNvml(SimNvml):
    """Simulated GPUs of compute capability 7.0: they reset only with their NVLink peers."""

    def device_info(self, index: int) -> DeviceInfo:
        return dataclasses.replace(super().device_info(index), compute_capability_major=7)


def resetter(root: HostRoot, nvml: SimNvml) -> GpuResetter:
    reloader = Reloader(root, SimKernel(root), VirtualClock(), 0.01)
    return GpuResetter(root, reloader, lambda: nvml, simreset.SimFunctionResets(root))


async def test_an_older_gpu_whose_nvlink_peer_computes_is_not_reset_alone(host: HostRoot) -> None:
    nvml = VoltaNvml(GPUS, node=NODE, module_state=HostRootModules(host.path))
    nvml.start_process(5, pid=31337, used_memory_bytes=2**30)

    answer = await resetter(host, nvml).reset("cmd-1", reset_gpu(2))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.NOT_SUPPORTED
    assert f"resets only with its NVLink peers, in use: {uuid(5)}" in answer.message


async def test_an_older_gpu_resets_alone_when_its_peers_are_idle(host: HostRoot) -> None:
    nvml = VoltaNvml(GPUS, node=NODE, module_state=HostRootModules(host.path))

    answer = await resetter(host, nvml).reset("cmd-1", reset_gpu(2))

    assert isinstance(answer, remediation_commands.GpuReset)
    assert answer.method is Method.NVML


async def test_a_process_nvml_lists_on_the_gpu_is_in_use(host: HostRoot) -> None:
    nvml = SimNvml(GPUS, node=NODE, module_state=HostRootModules(host.path))
    nvml.start_process(2, pid=31337, used_memory_bytes=2**30)

    answer = await resetter(host, nvml).reset("cmd-1", reset_gpu(2))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.IN_USE
    assert "?[31337]" in answer.message


async def test_a_gpu_still_failing_after_its_reset_is_reset_failed(host: HostRoot) -> None:
    nvml = SimNvml(GPUS, node=NODE)  # no module state: it never sees the reset
    with opened(nvml):
        nvml.inject_ecc(2, volatile_uncorrected=1)

    answer = await resetter(host, nvml).reset("cmd-1", reset_gpu(2))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.RESET_FAILED
    assert "uncorrectable ECC errors" in answer.message


async def test_a_gpu_fallen_off_the_bus_answers_again_after_a_driver_reload(
    host: HostRoot,
) -> None:
    nvml = SimNvml(GPUS, node=NODE, module_state=HostRootModules(host.path))
    nvml.lose_gpu(4)
    alone = await resetter(host, nvml).reset("cmd-1", reset_gpu(4))

    reloaded = await resetter(host, nvml).reset("cmd-2", reset_gpu(4, reload=True))

    assert isinstance(alone, remediation_commands.GpuResetFailed)
    assert alone.reason is Reason.NOT_SUPPORTED
    assert "GPU 4 does not answer" in alone.message
    assert isinstance(reloaded, remediation_commands.GpuReset)
    assert reloaded.method is Method.DRIVER_RELOAD
    assert modules.module_version(host, "nvidia") == OLD


# the real path: sysfs under the host root


def test_nvml_bus_ids_name_their_sysfs_function() -> None:
    assert sysfs_address("00000000:1A:00.0") == "0000:1a:00.0"
    assert reset_file("00000001:C3:1F.7") == "sys/bus/pci/devices/0001:c3:1f.7/reset"
    with pytest.raises(ValueError, match="not a PCI bus id"):
        sysfs_address("18:00.0/../../reset")


async def test_the_sysfs_reset_writes_1_to_the_functions_reset_file(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    device = root.join("sys/devices/pci0000:00/0000:18:00.0")
    device.mkdir(parents=True)
    (device / "reset").write_text("")
    root.join("sys/bus/pci/devices").mkdir(parents=True)
    root.join("sys/bus/pci/devices/0000:18:00.0").symlink_to(
        "../../../devices/pci0000:00/0000:18:00.0"
    )
    resets = SysfsFunctionResets(root)

    assert resets.offered("00000000:18:00.0")
    assert not resets.offered("00000000:19:00.0")
    await resets.reset("00000000:18:00.0")
    assert (device / "reset").read_text() == "1"


async def test_a_sysfs_reset_the_kernel_refuses_raises_with_its_error(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    root.join("sys/bus/pci/devices/0000:18:00.0/reset").mkdir(parents=True)  # EISDIR

    with pytest.raises(FunctionResetFailed, match=r"0000:18:00\.0/reset failed"):
        await SysfsFunctionResets(root).reset("00000000:18:00.0")


async def test_a_wedged_gpu_fails_even_the_driver_reload_until_the_node_reboots(
    harness: Harness,
) -> None:
    simreset.set_fault(harness.root, simreset.STUCK)

    answer = await harness.send(reset_gpu(0, reload=True))

    assert isinstance(answer, remediation_commands.GpuResetFailed)
    assert answer.reason is Reason.RESET_FAILED
    assert f"the GPU driver {OLD} did not load again" in answer.message
    SimKernel(harness.root).reboot(load=("nvidia", "nvidia_uvm"))
    assert simreset.fault(harness.root) == ""
    assert modules.module_version(harness.root, "nvidia") == OLD
    again = await harness.send(reset_gpu(0))
    assert isinstance(again, remediation_commands.GpuReset)


def test_an_unknown_fault_word_is_refused(host: HostRoot) -> None:
    with pytest.raises(ValueError, match="unknown GPU reset fault 'melt'"):
        simreset.set_fault(host, "melt")


async def test_the_persistence_daemon_keeps_no_gpu_from_its_reset_but_from_a_reload(
    harness: Harness,
) -> None:
    hold_gpu(harness.root, 900, minor=1, name="nvidia-persiste")  # comm is cut at 15

    alone = await harness.send(reset_gpu(1))
    simreset.set_fault(harness.root, simreset.UNSUPPORTED)
    reload = await harness.send(reset_gpu(1, reload=True))

    assert isinstance(alone, remediation_commands.GpuReset)
    assert isinstance(reload, remediation_commands.GpuResetFailed)
    assert reload.reason is Reason.IN_USE
    assert "nvidia-persiste[900]" in reload.message


async def test_a_reset_resumed_after_a_crash_mid_reload_loads_the_driver_again(
    host: HostRoot,
) -> None:
    nvml = SimNvml(GPUS, node=NODE, module_state=HostRootModules(host.path))
    resets = resetter(host, nvml)
    context = await resets.context()
    for module in ("nvidia_uvm", "nvidia"):  # the first run unloaded, then the agent died
        SimKernel(host).rmmod(module)

    answer = await resets.reset("cmd-1", reset_gpu(2), context)

    assert context.from_version == OLD
    assert modules.module_version(host, "nvidia") == OLD
    assert {"nvidia", "nvidia_uvm"} <= {m.name for m in modules.loaded_modules(host)}
    assert isinstance(answer, remediation_commands.GpuReset)
