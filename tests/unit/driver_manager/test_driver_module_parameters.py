"""The driver-manager loads the modules with the parameters a command carries (the policy's
`kernelModuleParameters`), answers with what each module shows of them and records it in its
state; a value the module's type refuses fails the load, and a rollback loads the modules
with the parameters they ran with before."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.host import parameters
from gpuop.host.roots import HostRoot
from gpuop_sim.host.simkernel import SimKernel
from tests.support.driver_manager import OLD, Harness

GPU = dm.Component.GPU
BEFORE = {"nvidia": {"NVreg_EnableGpuFirmware": "1"}}
AFTER = {"nvidia": {"NVreg_EnableGpuFirmware": "0"}, "nvidia_uvm": {"uvm_disable_hmm": "Y"}}


async def reload(harness: Harness, options: dict[str, dict[str, str]]) -> dm.DriverResult:
    unloaded = await harness.send(dm.UnloadDriver(component=GPU))
    assert isinstance(unloaded, dm.DriverUnloaded), unloaded
    answer = await harness.send(dm.LoadDriver(component=GPU, version=OLD, parameters=options))
    assert isinstance(answer, dm.DriverResult)
    return answer


async def test_a_load_passes_the_parameters_and_records_what_the_modules_show(
    harness: Harness, host: HostRoot
) -> None:
    loaded = await reload(harness, AFTER)
    assert isinstance(loaded, dm.DriverLoaded), loaded
    assert loaded.parameters == AFTER
    assert parameters.shown(host, "nvidia") == AFTER["nvidia"]
    assert parameters.shown(host, "nvidia_uvm") == AFTER["nvidia_uvm"]
    assert harness.store.load().component("gpu").parameters == AFTER
    SimKernel(host).reboot(load=("nvidia", "nvidia_uvm"))  # modprobe.d has them for the boot
    assert parameters.shown(host, "nvidia") == AFTER["nvidia"]
    assert parameters.shown(host, "nvidia_uvm") == AFTER["nvidia_uvm"]

    loaded = await reload(harness, {})  # a load without: the module defaults again
    assert isinstance(loaded, dm.DriverLoaded) and loaded.parameters == {}
    assert parameters.shown(host, "nvidia") == {}
    assert harness.store.load().component("gpu").parameters == {}
    assert parameters.configured(host) == {}  # the file is gone with them


async def test_a_parameter_the_module_does_not_declare_is_left_out_of_the_answer(
    harness: Harness,
) -> None:
    loaded = await reload(
        harness, {"nvidia": {"NVreg_EnableGpuFirmwre": "0", "NVreg_EnableMSI": "1"}}
    )
    assert isinstance(loaded, dm.DriverLoaded), loaded
    assert loaded.parameters == {"nvidia": {"NVreg_EnableMSI": "1"}}


async def test_a_value_the_type_refuses_fails_the_load_and_a_rollback_restores_the_old_ones(
    harness: Harness, host: HostRoot
) -> None:
    assert isinstance(await reload(harness, BEFORE), dm.DriverLoaded)
    failed = await reload(harness, {"nvidia": {"NVreg_EnableGpuFirmware": "off"}})
    assert isinstance(failed, dm.DriverLoadFailed), failed
    assert failed.reason is dm.LoadFailureReason.MODULE_ERROR
    assert "Invalid argument" in failed.message
    assert parameters.shown(host, "nvidia") == {}  # not loaded

    back = await harness.send(dm.RollbackDriver(component=GPU, version=OLD, parameters=BEFORE))
    assert isinstance(back, dm.DriverRolledBack), back
    assert parameters.shown(host, "nvidia") == BEFORE["nvidia"]
    assert harness.store.load().component("gpu").parameters == BEFORE
