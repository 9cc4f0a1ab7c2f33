"""The MPS control daemons on a simulated node, real processes throughout: the host root's
stand-in `nvidia-cuda-mps-control` started by `MpsControl` with the config's limits, kept
by `MpsSupervisor` (a SIGKILLed daemon is found out and started again, with its limits), quit
when no longer wanted, and a host without the program refused with what to install."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuop.events.device import MpsDaemonChanged, MpsDaemonState
from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin.errors import MpsProgramMissing
from gpuop.services.device_plugin.mps import MIB, MpsDaemon
from gpuop.services.device_plugin.mpscontrol import MpsControl, MpsSupervisor
from gpuop.services.device_plugin.resources import gpu_resources, mps_daemons
from gpuop_sim.host import mpscontrol as standin
from tests.support.device_plugin import config, sim_inventory
from tests.support.kubelet_plugin import build_host, sim_mps
from tests.support.mps import ask, daemon_pid, end_daemons, mps_document, received
from tests.support.waiting import eventually


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    root = build_host(tmp_path / "host", 2)
    yield root
    end_daemons(root)


def planned(root: HostRoot, replicas: int = 4) -> MpsDaemon:
    plan = gpu_resources(sim_inventory(root, gpus=2), config(mps_document(replicas)))
    (daemon,) = mps_daemons(plan)
    return daemon


def drained(supervisor: MpsSupervisor) -> list[MpsDaemonChanged]:
    changes = list(supervisor.changes)
    supervisor.changes.clear()
    return changes


def test_a_seeded_gpu_host_has_the_program_where_the_driver_puts_it(host: HostRoot) -> None:
    assert MpsControl(host, chroot=False).locate() == "/usr/bin/nvidia-cuda-mps-control"
    assert os.access(host.join(standin.INSTALLED_AT), os.X_OK)


async def test_the_daemon_starts_with_the_configs_limits(host: HostRoot) -> None:
    daemon = planned(host)
    control = MpsControl(host, chroot=False)
    await control.start(daemon)
    share = sim_inventory(host, gpus=2).gpus[0].whole.memory_bytes // 4 // MIB
    assert received(host) == [  # in upstream's order, memory first
        f"set_default_device_pinned_mem_limit 0 {share}M",
        f"set_default_device_pinned_mem_limit 1 {share}M",
        "set_default_active_thread_percentage 25",
    ]
    assert daemon_pid(host) is not None
    assert ask(host, "get_default_active_thread_percentage") == "25.0"
    assert ask(host, "get_default_device_pinned_mem_limit 1") == f"{share}M"
    assert await control.answers(daemon)

    await control.quit(daemon)
    await eventually(lambda: daemon_pid(host) is None)
    assert not await control.answers(daemon)


async def test_a_daemon_left_running_is_replaced_so_the_limits_are_the_configs(
    host: HostRoot,
) -> None:
    control = MpsControl(host, chroot=False)
    await control.start(planned(host, replicas=2))  # a plugin that was killed left it
    left = daemon_pid(host)
    daemon = planned(host, replicas=4)
    await control.start(daemon)
    assert daemon_pid(host) not in (None, left)
    assert ask(host, "get_default_active_thread_percentage") == "25.0"
    await control.quit(daemon)


async def test_a_sigkilled_daemon_is_started_again_with_its_limits(host: HostRoot) -> None:
    supervisor = sim_mps(host)
    daemon = planned(host)
    assert await supervisor.apply([daemon], "unused")
    assert supervisor.running(daemon.resource)
    first = daemon_pid(host)
    assert first is not None

    os.kill(first, signal.SIGKILL)
    await eventually(lambda: daemon_pid(host) is None)
    assert await supervisor.check(), "the check finds it gone"
    assert not supervisor.running(daemon.resource)
    assert "stopped answering" in (supervisor.problem or "")

    await eventually(supervisor.check)  # its backoff passes, and it starts again
    assert supervisor.running(daemon.resource)
    assert supervisor.problem is None
    second = daemon_pid(host)
    assert second not in (None, first)
    assert ask(host, "get_default_active_thread_percentage") == "25.0", "limits set again"
    assert [(c.state, c.restarts) for c in drained(supervisor)] == [
        (MpsDaemonState.RUNNING, 0),
        (MpsDaemonState.FAILED, 0),
        (MpsDaemonState.RUNNING, 1),
    ]

    assert await supervisor.apply([], "the GPU driver is paused for a reload")
    await eventually(lambda: daemon_pid(host) is None)
    (stopped,) = drained(supervisor)
    assert (stopped.state, stopped.message) == (
        MpsDaemonState.STOPPED,
        "the GPU driver is paused for a reload",
    )


async def test_the_same_daemon_wanted_again_is_left_running(host: HostRoot) -> None:
    supervisor = sim_mps(host)
    await supervisor.apply([planned(host)], "unused")
    pid = daemon_pid(host)
    assert not await supervisor.apply([planned(host)], "unused")
    assert daemon_pid(host) == pid

    assert await supervisor.apply([planned(host, replicas=8)], "the config changed")
    assert daemon_pid(host) not in (None, pid)
    assert ask(host, "get_default_active_thread_percentage") == "12.0"
    states = [(c.state, c.replicas, c.message) for c in drained(supervisor)]
    assert states == [
        (MpsDaemonState.RUNNING, 4, ""),
        (MpsDaemonState.STOPPED, 4, "the config changed"),
        (MpsDaemonState.RUNNING, 8, ""),
    ]
    await supervisor.apply([], "done")


async def test_a_host_without_the_program_fails_saying_what_to_install(host: HostRoot) -> None:
    host.join(standin.INSTALLED_AT).unlink()
    control = MpsControl(host, chroot=False)
    with pytest.raises(MpsProgramMissing) as missing:
        control.locate()
    message = str(missing.value)
    assert "nvidia-cuda-mps-control is not on the host" in message
    assert "/usr/bin/nvidia-cuda-mps-control" in message
    assert "install the NVIDIA driver's user-space tools" in message

    supervisor = sim_mps(host)
    daemon = planned(host)
    assert await supervisor.apply([daemon], "unused")
    assert not supervisor.running(daemon.resource)
    assert message in (supervisor.problem or "")
    (failed,) = drained(supervisor)
    assert (failed.state, failed.message) == (MpsDaemonState.FAILED, message)

    standin.install(host.path)  # the tools installed: the next attempt starts it
    await eventually(supervisor.check)
    assert supervisor.running(daemon.resource)
    (running,) = drained(supervisor)
    assert (running.state, running.restarts) == (MpsDaemonState.RUNNING, 1)
    await supervisor.apply([], "done")
