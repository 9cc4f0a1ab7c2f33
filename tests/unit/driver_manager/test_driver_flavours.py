"""The install takes the package of the flavour the command asks for (`InstallDriver.flavour`):
it refuses a source without one, naming what the source has; a format-1 package (no flavour:
the simulation's stand-ins) serves either; the same version installed with the other modules
is replaced. Modules are tiny ELF files with a `.modinfo` section
(`tests.support.kernel_modules`)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from gpuop.clocks import VirtualClock
from gpuop.events import driver as dm
from gpuop.events.driver import InstallFailureReason
from gpuop.host import kmod, packages, packaging
from gpuop.host.errors import KernelToolMissing
from gpuop.host.manifests import Flavour, Role
from gpuop.host.protocol import Rebooter
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import installing, sources
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.driver_manager.executor import Executor
from gpuop.services.driver_manager.reloading import Reloader
from gpuop.services.driver_manager.state import ComponentRecord, StepContext
from gpuop.services.driver_manager.validating import Validator
from gpuop_sim.host import keys, seeding
from tests.support.driver_manager import TRUSTED, recorded_host, source_of
from tests.support.kernel_modules import module_elf

KERNEL = "6.1.0-57-amd64"
VERSION = "535.261.03"


@pytest.fixture(autouse=True)
def kmod_installed() -> None:
    for tool in ("modinfo", "depmod"):
        try:
            kmod.tool(tool)
        except KernelToolMissing:
            pytest.fail(f"{tool} is not installed: apt-get install kmod")


def host(tmp_path: Path) -> HostRoot:
    return seeding.seed_host_root(
        tmp_path / "host", recorded_host(), gpu_version=None, kernel_release=KERNEL
    )


def build(source: Path, flavour: Flavour) -> packaging.BuiltPackage:
    """A format-2 package of `flavour` whose `nvidia.ko` says which it is (its license, as
    the real modules' do: `Dual MIT/GPL` open, `NVIDIA` proprietary)."""
    vermagic = f"{KERNEL} SMP preempt mod_unload modversions "
    license_ = "Dual MIT/GPL" if flavour is Flavour.OPEN else "NVIDIA"
    files = {
        "modules/nvidia.ko": packaging.PackageContent(
            module_elf("nvidia", vermagic, version=VERSION, license=license_), Role.MODULE
        ),
        f"userspace/lib/libnvidia-ml.so.{VERSION}": packaging.PackageContent(
            b"\x7fELF nvml", Role.LIBRARY
        ),
    }
    built = packaging.write_package_v2(
        source,
        component="gpu",
        version=VERSION,
        flavour=flavour,
        kernel_release=KERNEL,
        files=files,
    )
    packaging.add_to_index(source, built, keys.SIGNING_KEY)
    return built


def installer(root: HostRoot) -> installing.Installer:
    return installing.Installer(
        root, kmod.HostRootKernel(root), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    )


def installed_license(root: HostRoot) -> str:
    module = packages.package_dir(root, KERNEL, "gpu", VERSION) / "modules" / "nvidia.ko"
    [license_] = kmod.modinfo(module)["license"]
    return license_


async def test_the_install_takes_the_package_of_the_asked_flavour(tmp_path: Path) -> None:
    root = host(tmp_path)
    source = tmp_path / "source"
    build(source, Flavour.OPEN)
    proprietary = build(source, Flavour.PROPRIETARY)

    done = await installer(root).install("gpu", VERSION, source_of(source), "proprietary")

    assert (done.sha256, done.flavour) == (proprietary.sha256, "proprietary")
    assert installed_license(root) == "NVIDIA"


async def test_a_source_without_the_flavour_is_refused_naming_what_it_has(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    source = tmp_path / "source"
    build(source, Flavour.OPEN)

    with pytest.raises(installing.InstallError) as refused:
        await installer(root).install("gpu", VERSION, source_of(source), "proprietary")

    assert refused.value.reason is InstallFailureReason.NOT_FOUND
    assert not refused.value.retryable
    assert f"no proprietary build for kernel {KERNEL} (it has: open)" in refused.value.message
    assert not packages.package_dir(root, KERNEL, "gpu", VERSION).exists()


async def test_the_same_version_with_the_other_modules_is_replaced(tmp_path: Path) -> None:
    root = host(tmp_path)
    source = tmp_path / "source"
    build(source, Flavour.OPEN)
    build(source, Flavour.PROPRIETARY)
    first = await installer(root).install("gpu", VERSION, source_of(source), "open")
    assert (first.flavour, installed_license(root)) == ("open", "Dual MIT/GPL")

    again = await installer(root).install("gpu", VERSION, source_of(source), "open")
    assert (again.fresh, again.flavour) == (False, "open")  # already there: kept
    switched = await installer(root).install("gpu", VERSION, source_of(source), "proprietary")

    assert (switched.fresh, switched.flavour) == (True, "proprietary")
    assert installed_license(root) == "NVIDIA"
    component = packages.component_dir(root, KERNEL, "gpu")
    assert [p.name for p in component.iterdir() if p.is_dir()] == [VERSION]  # no debris
    dep = root.join(f"lib/modules/{KERNEL}/modules.dep").read_text()
    assert f"updates/gpuop/gpu/{VERSION}/modules/nvidia.ko:" in dep


def index_of(*entries: dict[str, str]) -> sources.SourceIndex:
    common = {"component": "gpu", "version": VERSION, "kernel_release": KERNEL, "sha256": "a" * 64}
    return sources.SourceIndex.model_validate(
        {"packages": [{**common, **entry} for entry in entries]}
    )


def test_a_format_1_package_serves_either_flavour_and_a_format_2_one_only_its_own() -> None:
    v1_only = index_of({"file": "gpu-v1.tar.gz"})
    open_only = index_of({"file": "gpu-open.tar.gz", "flavour": "open"})

    for flavour in ("open", "proprietary"):
        assert sources.select(v1_only, "/srv", "gpu", VERSION, KERNEL, flavour).file == (
            "gpu-v1.tar.gz"
        )
    with pytest.raises(sources.SourceError) as refused:
        sources.select(open_only, "/srv", "gpu", VERSION, KERNEL, "proprietary")
    assert refused.value.reason is InstallFailureReason.NOT_FOUND
    assert f"no proprietary build for kernel {KERNEL} (it has: open)" in refused.value.message


def test_a_format_2_package_of_the_flavour_is_preferred_to_a_format_1_one() -> None:
    both = index_of(
        {"file": "gpu-v1.tar.gz"},
        {"file": "gpu-proprietary.tar.gz", "flavour": "proprietary"},
    )

    chosen = sources.select(both, "/srv", "gpu", VERSION, KERNEL, "proprietary")
    assert chosen.file == "gpu-proprietary.tar.gz"
    assert sources.select(both, "/srv", "gpu", VERSION, KERNEL).file == "gpu-v1.tar.gz"


class _Reloads:
    """A reloader that unloads and loads at once (the host root runs no kernel)."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    async def unload(self, component: str, timeout: float, allow: bool) -> tuple[str, ...]:
        return ()

    async def load(
        self, component: str, version: str, wanted: tuple[str, ...], options: object = None
    ) -> tuple[str, ...]:
        self.loaded.append(version)
        return ("nvidia",)

    def parameters_shown(self, options: object) -> dict[str, dict[str, str]]:
        return {}


async def test_a_rollback_of_a_flavour_change_installs_the_old_modules_again(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    source = tmp_path / "source"
    build(source, Flavour.OPEN)
    build(source, Flavour.PROPRIETARY)
    await installer(root).install("gpu", VERSION, source_of(source), "open")  # the new ones
    reloads = _Reloads()
    executor = Executor(
        root, DriverManagerConfig(trust=TRUSTED), installer(root), cast(Reloader, reloads),
        cast(Validator, None), cast(Rebooter, None),
    )  # fmt: skip
    back = dm.RollbackDriver(
        component=dm.Component.GPU, version=VERSION, source=source_of(source),
        flavour=dm.Flavour.PROPRIETARY,
    )  # fmt: skip

    outcome = await executor.execute("c1", back, StepContext(), ComponentRecord())

    assert isinstance(outcome.result, dm.DriverRolledBack), outcome.result
    assert installed_license(root) == "NVIDIA"
    assert reloads.loaded == [VERSION]
    no_source = dm.RollbackDriver(
        component=dm.Component.GPU, version=VERSION, flavour=dm.Flavour.OPEN
    )
    refused = await executor.execute("c2", no_source, StepContext(), ComponentRecord())
    assert isinstance(refused.result, dm.DriverRollbackFailed)
    assert "installed with other kernel modules than open" in refused.result.message
