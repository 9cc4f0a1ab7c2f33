"""The validation ladder's driver rungs on a simulated H200 host, driven through the bus:
`ValidateDriver` with `check: cuda` (the simulated node's CUDA probe, healthy or told to
fail or hang) and `check: peermem` (nvidia_peermem and the RDMA core's peer memory
registry)."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.host.roots import HostRoot
from gpuop_sim.host import simcuda
from tests.support.driver_manager import OLD, Harness

GPU = dm.Component.GPU
CUDA = dm.ValidationCheck.CUDA
PEERMEM = dm.ValidationCheck.PEERMEM


def cuda(version: str = OLD, **fields: object) -> dm.ValidateDriver:
    return dm.ValidateDriver(component=GPU, version=version, check=CUDA, **fields)


def tell_cuda(host: HostRoot, fault: str) -> None:
    path = host.join(simcuda.FAULT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fault)


async def test_a_healthy_node_takes_a_cuda_context_on_every_gpu(harness: Harness) -> None:
    validated = await harness.send(cuda(expected_devices=8))
    assert validated == dm.DriverValidated(
        command_id=harness.sent[-1], component=GPU, version=OLD, devices=8
    )


async def test_a_cuda_error_fails_the_rung_at_once_naming_the_error(
    harness: Harness, host: HostRoot
) -> None:
    tell_cuda(host, "201")
    failed = await harness.send(cuda(timeout_seconds=60))
    assert isinstance(failed, dm.DriverValidationFailed)
    assert failed.reason is dm.LoadFailureReason.CUDA_FAILED
    assert failed.message == "cuCtxCreate failed: CUDA_ERROR_INVALID_CONTEXT (201): GPU 0"
    assert not failed.retryable


async def test_a_hung_cuda_probe_fails_the_rung_at_its_timeout(
    harness: Harness, host: HostRoot
) -> None:
    tell_cuda(host, simcuda.HANG)
    failed = await harness.send(cuda(timeout_seconds=1))
    assert isinstance(failed, dm.DriverValidationFailed)
    assert failed.reason is dm.LoadFailureReason.CUDA_FAILED
    assert "hung past 1 s" in failed.message


async def test_cuda_seeing_fewer_gpus_than_expected_fails_the_rung(harness: Harness) -> None:
    short = await harness.send(cuda(expected_devices=9))
    assert isinstance(short, dm.DriverValidationFailed)
    assert short.reason is dm.LoadFailureReason.NO_DEVICES
    assert short.message == "CUDA sees 8 GPUs, 9 expected"


async def test_the_cuda_rung_checks_the_running_version_first(harness: Harness) -> None:
    wrong = await harness.send(cuda(version="580.95.05"))
    assert isinstance(wrong, dm.DriverValidationFailed)
    assert wrong.reason is dm.LoadFailureReason.VERSION_MISMATCH
    await harness.send(dm.UnloadDriver(component=GPU))
    absent = await harness.send(cuda())
    assert isinstance(absent, dm.DriverValidationFailed)
    assert absent.reason is dm.LoadFailureReason.MODULE_ERROR


def load_peermem(host: HostRoot) -> None:
    """What the kernel shows of a loaded nvidia_peermem (the simulated kernel does not
    build it)."""
    module = host.join("sys/module/nvidia_peermem")
    module.mkdir(parents=True)
    (module / "version").write_text(f"{OLD}\n")
    (module / "initstate").write_text("live\n")


async def test_peermem_fails_while_nvidia_peermem_is_not_loaded(harness: Harness) -> None:
    failed = await harness.send(dm.ValidateDriver(component=GPU, version=OLD, check=PEERMEM))
    assert isinstance(failed, dm.DriverValidationFailed)
    assert failed.reason is dm.LoadFailureReason.PEERMEM_NOT_REGISTERED
    assert failed.message == "nvidia_peermem is not loaded"


async def test_peermem_must_be_in_the_rdma_cores_registry_where_it_keeps_one(
    harness: Harness, host: HostRoot
) -> None:
    load_peermem(host)
    registry = host.join("sys/kernel/mm/memory_peers")
    (registry / "amdkfd").mkdir(parents=True)
    failed = await harness.send(dm.ValidateDriver(component=GPU, version=OLD, check=PEERMEM))
    assert isinstance(failed, dm.DriverValidationFailed)
    assert failed.reason is dm.LoadFailureReason.PEERMEM_NOT_REGISTERED
    assert "nv_mem is not in sys/kernel/mm/memory_peers (registered: amdkfd)" in failed.message

    (registry / "nv_mem").mkdir()
    (registry / "nv_mem/version").write_text("1.3\n")
    validated = await harness.send(
        dm.ValidateDriver(component=GPU, version=OLD, check=PEERMEM, expected_devices=8)
    )
    assert validated == dm.DriverValidated(
        command_id=harness.sent[-1], component=GPU, version=OLD, devices=8
    )


async def test_peermem_loaded_passes_where_the_rdma_core_keeps_no_registry(
    harness: Harness, host: HostRoot
) -> None:
    load_peermem(host)
    validated = await harness.send(dm.ValidateDriver(component=GPU, version=OLD, check=PEERMEM))
    assert isinstance(validated, dm.DriverValidated)
