"""XIDs from the host's kernel log: acted on as NVML's, once when both sources report one,
never repeated across a restart, history before the first start left alone, and still read
when NVML no longer opens."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events.device import DeviceHealthChanged, HealthReason, XidAction
from gpuop.nvml import XidEvent
from gpuop.services.telemetry.kernel_log import KernelLog
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.node_agents import NODE, published, running, wait_for
from tests.support.telemetry import QUIET, CountingNvml, uuid_of
from tests.support.waiting import eventually

BOOT = "5c8e0d1a-6f3b-4b7e-9a21-3d4c5b6a7f80"


class HostRoot:
    """A host root with a kernel log (a regular file: one record per line) and a boot id."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "proc/sys/kernel/random").mkdir(parents=True)
        (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
        (root / "dev").mkdir()
        self.kmsg = root / "dev/kmsg"
        self.kmsg.write_text("6,1,100,-;Linux version 6.1.0-57-amd64\n")
        self.seq = 1

    def xid(self, pci: str, xid: int, text: str = "pid=42, name=python3, boom") -> None:
        self.seq += 1
        with self.kmsg.open("a") as stream:
            stream.write(f"3,{self.seq},{self.seq * 1000},-;NVRM: Xid (PCI:{pci}): {xid}, {text}\n")


def _pci(exporter: NodeExporter, index: int) -> str:
    inventory = exporter.session.inventory
    assert inventory is not None
    return inventory.gpus[index].pci_bus_id.split(".")[0][-10:]  # "0000:BB:DD" as NVRM prints


def _exporter(
    bus: InMemoryBus, nvml: CountingNvml, registry: CollectorRegistry, root: Path
) -> NodeExporter:
    return NodeExporter(bus, NODE, nvml, QUIET, registry, kernel_log=KernelLog(root))


async def test_a_kernel_log_xid_is_a_health_event_once_and_never_again_after_a_restart(
    bus: InMemoryBus, nvml: CountingNvml, sim: SimNvml, tmp_path: Path
) -> None:
    host = HostRoot(tmp_path)
    host.xid("0000:00:00", 48, "from before gpuop ran")  # history: left alone
    registry = CollectorRegistry()
    exporter = _exporter(bus, nvml, registry, tmp_path)
    async with running(exporter):
        await eventually(lambda: exporter.session.inventory is not None)
        await exporter.read_kernel_log()  # the first read starts at the end
        host.xid(_pci(exporter, 3), 79, "pid=7, name=train, GPU has fallen off the bus.")
        await exporter.read_kernel_log()
        [(_, event)] = await wait_for(bus, DeviceHealthChanged, 1)
        # NVML reports the same fault a moment later: one fault, one event
        sim.inject_xid(3, 79)
        await eventually(
            lambda: (
                registry.get_sample_value(
                    "gpuop_telemetry_xids_total", {"source": "nvml", "outcome": "duplicate"}
                )
                == 1
            )
        )
    assert (event.gpu_uuid, event.reason, event.xid, event.action) == (
        uuid_of(3),
        HealthReason.XID,
        79,
        XidAction.REBOOT,
    )
    assert len(await published(bus, DeviceHealthChanged)) == 1
    assert (
        registry.get_sample_value(
            "gpuop_telemetry_xids_total", {"source": "kernel-log", "outcome": "acted"}
        )
        == 1
    )

    again = _exporter(bus, nvml, CollectorRegistry(), tmp_path)
    async with running(again):
        await eventually(lambda: again.session.inventory is not None)
        await again.read_kernel_log()
    assert len(await published(bus, DeviceHealthChanged)) == 1, "a restart repeated a fault"


async def test_a_fault_on_an_address_no_gpu_has_is_counted_not_acted_on(
    bus: InMemoryBus, nvml: CountingNvml, tmp_path: Path
) -> None:
    host = HostRoot(tmp_path)
    registry = CollectorRegistry()
    exporter = _exporter(bus, nvml, registry, tmp_path)
    async with running(exporter):
        await eventually(lambda: exporter.session.inventory is not None)
        await exporter.read_kernel_log()
        host.xid("0000:ee:00", 48)
        await exporter.read_kernel_log()
    assert await published(bus, DeviceHealthChanged) == []
    assert (
        registry.get_sample_value(
            "gpuop_telemetry_xids_total", {"source": "kernel-log", "outcome": "unknown-gpu"}
        )
        == 1
    )


async def test_the_kernel_log_is_read_while_nvml_no_longer_opens(
    bus: InMemoryBus, nvml: CountingNvml, tmp_path: Path
) -> None:
    host = HostRoot(tmp_path)
    exporter = _exporter(bus, nvml, CollectorRegistry(), tmp_path)
    async with running(exporter):
        await eventually(lambda: exporter.session.inventory is not None)
        await exporter.read_kernel_log()
        pci = _pci(exporter, 0)
        # the session saw its inventory; now NVML is gone (closed, and it would not reopen)
        exporter._known = exporter.session.inventory
        await exporter.session.close()
        host.xid(pci, 79)
        await exporter.read_kernel_log()
        [(_, event)] = await wait_for(bus, DeviceHealthChanged, 1)
    assert (event.gpu_uuid, event.xid) == (uuid_of(0), 79)


async def test_an_nvml_xid_then_the_kernel_logs_is_one_event(
    bus: InMemoryBus, nvml: CountingNvml, tmp_path: Path
) -> None:
    host = HostRoot(tmp_path)
    exporter = _exporter(bus, nvml, CollectorRegistry(), tmp_path)
    async with running(exporter):
        await eventually(lambda: exporter.session.inventory is not None)
        await exporter.read_kernel_log()
        inventory = exporter.session.inventory
        assert inventory is not None
        gpu = inventory.gpus[2]
        await exporter.on_device_event(XidEvent(gpu.index, gpu.uuid, 48, None, None), inventory)
        host.xid(_pci(exporter, 2), 48)
        await exporter.read_kernel_log()
    assert len(await published(bus, DeviceHealthChanged)) == 1
