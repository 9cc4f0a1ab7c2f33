"""The OFED stack (mlx5_core, ib_core, mlx5_ib) goes through the same steps as the GPU
driver, and an unload that would cut the node's management path needs an explicit opt-in."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.host import modules, packages
from gpuop.host.roots import HostRoot
from tests.support.driver_manager import (
    KERNEL,
    OFED_NEW,
    OFED_OLD,
    Harness,
    running_agent,
    seed,
    source_of,
)

CONNECTX = "0000:00:07.0"


@pytest.fixture
def ofed_host(tmp_path: Path) -> HostRoot:
    """The seeded host with OFED 24.10 loaded and a ConnectX function bound to mlx5_core."""
    root = seed(tmp_path / "host", ofed=True)
    device = root.join(f"sys/devices/pci0000:00/{CONNECTX}")
    device.mkdir(parents=True)
    for name, value in (("vendor", "0x15b3"), ("device", "0x101d"), ("class", "0x020000")):
        (device / name).write_text(value + "\n")
    (device / "uevent").write_text("DRIVER=mlx5_core\nPCI_SLOT_NAME=0000:00:07.0\n")
    (device / "net/eth1").mkdir(parents=True)
    os.symlink(
        f"../../../devices/pci0000:00/{CONNECTX}", root.join(f"sys/bus/pci/devices/{CONNECTX}")
    )
    os.symlink("../../../bus/pci/drivers/mlx5_core", device / "driver")
    os.symlink(f"../../devices/pci0000:00/{CONNECTX}/net/eth1", root.join("sys/class/net/eth1"))
    return root


@pytest.fixture
async def ofed_harness(
    bus: InMemoryBus, ofed_host: HostRoot, source: Path
) -> AsyncIterator[Harness]:
    async with running_agent(bus, ofed_host, source) as running:
        yield running


def route_default_via(root: HostRoot, interface: str) -> None:
    root.join("proc/net").mkdir(parents=True, exist_ok=True)
    root.join("proc/net/route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        f"{interface}\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        f"{interface}\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    )


def ofed_loaded(root: HostRoot) -> list[str]:
    return [
        m.name
        for m in modules.loaded_modules(root)
        if m.name in ("mlx5_core", "ib_core", "mlx5_ib")
    ]


async def test_an_ofed_upgrade_takes_the_same_path(
    ofed_harness: Harness, ofed_host: HostRoot, source: Path
) -> None:
    unloaded = await ofed_harness.send(dm.UnloadDriver(component=dm.Component.OFED))
    assert isinstance(unloaded, dm.DriverUnloaded)
    assert unloaded.version == OFED_OLD
    assert unloaded.modules[0] == "mlx5_ib"
    assert ofed_loaded(ofed_host) == []
    assert modules.module_version(ofed_host, "nvidia") is not None  # the GPU stack is untouched

    installed = await ofed_harness.send(
        dm.InstallDriver(component=dm.Component.OFED, version=OFED_NEW, source=source_of(source))
    )
    assert isinstance(installed, dm.DriverInstalled)
    loaded = await ofed_harness.send(dm.LoadDriver(component=dm.Component.OFED, version=OFED_NEW))
    assert isinstance(loaded, dm.DriverLoaded)
    assert set(loaded.modules) == {"mlx5_core", "ib_core", "mlx5_ib"}
    assert loaded.modules[-1] == "mlx5_ib"
    validated = await ofed_harness.send(
        dm.ValidateDriver(component=dm.Component.OFED, version=OFED_NEW)
    )
    assert validated == dm.DriverValidated(
        command_id=ofed_harness.sent[-1], component=dm.Component.OFED, version=OFED_NEW, devices=1
    )
    rolled_back = await ofed_harness.send(
        dm.RollbackDriver(component=dm.Component.OFED, version=OFED_OLD)
    )
    assert isinstance(rolled_back, dm.DriverRolledBack)
    assert modules.module_version(ofed_host, "mlx5_core") == OFED_OLD
    assert packages.active_version(ofed_host, KERNEL, "ofed") == OFED_OLD


async def test_an_unload_that_would_cut_the_management_path_needs_an_opt_in(
    ofed_harness: Harness, ofed_host: HostRoot
) -> None:
    route_default_via(ofed_host, "eth1")
    refused = await ofed_harness.send(dm.UnloadDriver(component=dm.Component.OFED))
    assert isinstance(refused, dm.DriverUnloadFailed)
    assert refused.reason is dm.UnloadFailureReason.MANAGEMENT_INTERFACE
    assert "eth1 carries the node's default route" in refused.message
    assert len(ofed_loaded(ofed_host)) == 3

    allowed = await ofed_harness.send(
        dm.UnloadDriver(component=dm.Component.OFED, allow_management_interface=True)
    )
    assert isinstance(allowed, dm.DriverUnloaded)
    assert ofed_loaded(ofed_host) == []


async def test_a_default_route_on_another_nic_does_not_block(
    ofed_harness: Harness, ofed_host: HostRoot
) -> None:
    route_default_via(ofed_host, "eth0")  # the virtio NIC of the recorded host
    unloaded = await ofed_harness.send(dm.UnloadDriver(component=dm.Component.OFED))
    assert isinstance(unloaded, dm.DriverUnloaded)
