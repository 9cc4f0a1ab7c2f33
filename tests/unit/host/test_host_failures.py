"""kmod's real failure messages become typed errors."""

from __future__ import annotations

import pytest

from gpuop.host import errors
from gpuop.host.subprocesses import failure


def test_rmmod_names_the_modules_that_use_the_module() -> None:
    error = failure(
        "rmmod", "nvidia", "rmmod: ERROR: Module nvidia is in use by: nvidia_uvm nvidia_drm"
    )
    assert isinstance(error, errors.ModuleInUse)
    assert (error.module, error.holders) == ("nvidia", ("nvidia_uvm", "nvidia_drm"))


@pytest.mark.parametrize(
    "output", ["modprobe: FATAL: Module nvidia is in use.", "rmmod: ERROR: Module nvidia is in use"]
)
def test_in_use_by_handles_names_no_holders(output: str) -> None:
    error = failure("rmmod", "nvidia", output)
    assert isinstance(error, errors.ModuleInUse)
    assert (error.module, error.holders) == ("nvidia", ())


def test_a_module_missing_for_the_running_kernel() -> None:
    error = failure(
        "modprobe", "foo", "modprobe: FATAL: Module foo not found in directory /lib/modules/6.18.0"
    )
    assert isinstance(error, errors.ModuleNotFound)
    assert (error.module, error.kernel_release) == ("foo", "6.18.0")


def test_the_kernel_refusing_a_module() -> None:
    error = failure(
        "modprobe", "nvidia", "modprobe: ERROR: could not insert 'nvidia': No such device"
    )
    assert isinstance(error, errors.ModuleLoadFailed)
    assert (error.module, error.message) == ("nvidia", "No such device")


@pytest.mark.parametrize(
    "output",
    [
        "rmmod: ERROR: Module nvidia is not currently loaded",
        "modprobe: FATAL: Module nvidia is not in kernel.",
    ],
)
def test_a_module_that_is_not_loaded(output: str) -> None:
    assert isinstance(failure("rmmod", "nvidia", output), errors.ModuleNotLoaded)


def test_builtin_modules_and_missing_tools_under_chroot() -> None:
    builtin = failure("rmmod", "mlx5_core", "rmmod: ERROR: Module mlx5_core is builtin.")
    assert isinstance(builtin, errors.ModuleUnloadFailed)
    missing = failure(
        "modprobe", "nvidia", "chroot: failed to run command 'modprobe': No such file or directory"
    )
    assert isinstance(missing, errors.KernelToolMissing) and missing.tool == "modprobe"
    assert failure("modprobe", "nvidia", "something else entirely") is None
