"""The driver-manager's runtime-configure step (`ConfigureRuntime`) on the simulated node:
the drop-in written and the simulated runtime restarted and answering; a second command a
no-op without a restart; a runtime that does not come back (a fault, or a configuration it
refuses) has its earlier files back and fails with the reason; a run interrupted between the
write and the answer restarts again when the command comes back."""

from __future__ import annotations

import json

from gpuop.clocks import VirtualClock
from gpuop.events import driver as dm
from gpuop.host import runtimes
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager.runtimes import PENDING, RuntimeConfigurer
from gpuop_sim.host.simruntime import FAULT, SimRuntime
from tests.support.driver_manager import Harness

MAIN = """\
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""
NOT_ANSWERING = dm.RuntimeFailureReason.NOT_ANSWERING


def with_containerd(host: HostRoot, main: str = MAIN) -> None:
    config = host.join(runtimes.CONTAINERD_CONFIG)
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(main)


async def test_the_drop_in_is_written_and_the_runtime_answers_after_its_restart(
    harness: Harness, host: HostRoot
) -> None:
    with_containerd(host)
    answer = await harness.send(dm.ConfigureRuntime(timeout_seconds=30))
    assert isinstance(answer, dm.RuntimeConfigured)
    assert (answer.runtime, answer.changed, answer.config_version) == ("containerd", True, 2)
    assert answer.drop_in == "/etc/containerd/conf.d/99-nvidia.toml"
    assert "conf.d/99-nvidia.toml" in host.join(runtimes.CONTAINERD_CONFIG).read_text()
    assert not host.join(PENDING).exists()

    again = await harness.send(dm.ConfigureRuntime(timeout_seconds=30))
    assert isinstance(again, dm.RuntimeConfigured)
    assert not again.changed and again.restart_seconds is None


async def test_a_runtime_that_does_not_come_back_is_restored_and_fails_the_step(
    harness: Harness, host: HostRoot
) -> None:
    with_containerd(host)
    fault = host.join(FAULT)
    fault.parent.mkdir(parents=True, exist_ok=True)
    fault.write_text("down\n")
    answer = await harness.send(dm.ConfigureRuntime(timeout_seconds=2))
    assert isinstance(answer, dm.RuntimeConfigureFailed)
    assert answer.reason is NOT_ANSWERING
    assert "did not answer within 2 s" in answer.message
    assert host.join(runtimes.CONTAINERD_CONFIG).read_text() == MAIN
    assert not host.join(runtimes.CONTAINERD_DROP_IN).exists()
    assert not answer.restored  # the fault keeps it down with the old files too


async def test_a_configuration_the_runtime_refuses_is_undone(host: HostRoot) -> None:
    # an import the main config names already, broken: the restart fails to load it
    broken = MAIN.replace("version = 2\n", 'version = 2\nimports = ["extra/*.toml"]\n')
    with_containerd(host, broken)
    extra = host.join("etc/containerd/extra/10-site.toml")
    extra.parent.mkdir(parents=True)
    extra.write_text("[plugins\n")
    service = SimRuntime(host)
    configurer = RuntimeConfigurer(host, service, VirtualClock())
    answer = await configurer.configure("c-1", dm.ConfigureRuntime(timeout_seconds=3))
    assert isinstance(answer, dm.RuntimeConfigureFailed)
    assert answer.reason is NOT_ANSWERING
    assert service.restarts == 2
    assert host.join(runtimes.CONTAINERD_CONFIG).read_text() == broken


async def test_no_runtime_and_an_unparsable_one_fail_with_their_reason(host: HostRoot) -> None:
    configurer = RuntimeConfigurer(host, SimRuntime(host), VirtualClock())
    none = await configurer.configure("c-1", dm.ConfigureRuntime())
    assert isinstance(none, dm.RuntimeConfigureFailed)
    assert none.reason is dm.RuntimeFailureReason.NOT_FOUND
    with_containerd(host, "version = 2\n[plugins\n")
    unreadable = await configurer.configure("c-2", dm.ConfigureRuntime())
    assert isinstance(unreadable, dm.RuntimeConfigureFailed)
    assert unreadable.reason is dm.RuntimeFailureReason.UNREADABLE
    assert "config.toml: line 2" in unreadable.message


async def test_a_run_interrupted_before_the_answer_restarts_when_resumed(host: HostRoot) -> None:
    with_containerd(host)
    planned = runtimes.plan(host, runtimes.Runtime.CONTAINERD)
    # what the crashed run left: its marker, its files written, no restart seen
    marker = host.join(PENDING)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(
        json.dumps([{"relative": c.relative, "before": c.before} for c in planned.changes])
    )
    runtimes.apply(host, planned)
    service = SimRuntime(host)
    configurer = RuntimeConfigurer(host, service, VirtualClock())
    answer = await configurer.configure("c-1", dm.ConfigureRuntime())
    assert isinstance(answer, dm.RuntimeConfigured) and answer.changed
    assert service.restarts == 1 and not marker.exists()


async def test_a_resumed_run_that_fails_undoes_to_the_files_before_the_first_run(
    host: HostRoot,
) -> None:
    with_containerd(host)
    planned = runtimes.plan(host, runtimes.Runtime.CONTAINERD)
    marker = host.join(PENDING)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(
        json.dumps([{"relative": c.relative, "before": c.before} for c in planned.changes])
    )
    runtimes.apply(host, planned)
    fault = host.join(FAULT)
    fault.parent.mkdir(parents=True, exist_ok=True)
    fault.write_text("down\n")
    configurer = RuntimeConfigurer(host, SimRuntime(host), VirtualClock())
    answer = await configurer.configure("c-1", dm.ConfigureRuntime(timeout_seconds=2))
    assert isinstance(answer, dm.RuntimeConfigureFailed)
    assert host.join(runtimes.CONTAINERD_CONFIG).read_text() == MAIN
    assert not host.join(runtimes.CONTAINERD_DROP_IN).exists()
