"""An agent killed in the middle of an install, over a real nats-server: `gpuop run
driver-manager` runs as its own process, pauses between unpacking and the rename (the
`install_pause_seconds` fault injection), is SIGKILLed there, and a restarted agent removes
the debris, finishes the install once, and answers once, with the old driver running
throughout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gpuop.bus import NatsBus, NatsServer
from gpuop.events import driver as dm
from gpuop.events import new_command
from gpuop.host import modules, packages
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import agent as agents
from gpuop_sim.host import keys
from tests.support.driver_manager import (
    KERNEL,
    NEW,
    NODE,
    OLD,
    SAGA,
    build_source,
    driver_events,
    result_of,
    seed,
    source_of,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.nats

TRUST = f"trust: {json.dumps(keys.TRUST)}\n"
"""The simulated node's driver trust anchor, as its config carries it."""


@asynccontextmanager
async def agent_process(
    nats: NatsServer, root: HostRoot, config: Path, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUOP_")}
    with log.open("ab") as output:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuop.cli.main", "run", "driver-manager",
            "--node", NODE, "--nats", nats.url, "--host-root", str(root.path),
            "--nvml", "sim:8", "--config", str(config), "--log-format", "text",
            stdout=output, stderr=output, env=environ,
        )  # fmt: skip
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def wait_until(condition: object, what: str, timeout: float = 20.0) -> None:
    assert callable(condition)
    try:
        await eventually(condition, timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def assert_old_driver_running(root: HostRoot) -> None:
    assert [m.name for m in modules.loaded_modules(root)] == ["nvidia_uvm", "nvidia"]
    assert modules.module_version(root, "nvidia") == OLD
    assert packages.active_version(root, KERNEL, "gpu") == OLD


async def test_an_agent_killed_mid_install_is_restarted_and_finishes_once(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    root = seed(tmp_path / "host")
    build_source(tmp_path / "source")
    config, log = tmp_path / "driver-manager.yaml", tmp_path / "agent.log"
    config.write_text(
        f"kernel: simulated\nack_wait_seconds: 1\ninstall_pause_seconds: 120\n{TRUST}"
    )
    bus = NatsBus(nats_server.url, name="test")
    await bus.start()
    try:
        install = dm.InstallDriver(
            component=dm.Component.GPU, version=NEW, source=source_of(tmp_path / "source")
        )
        command = new_command(
            install, node=NODE, source="/gpuop/test", id="install-1", correlationid=SAGA
        )
        await bus.publish(command)
        component_dir = packages.component_dir(root, KERNEL, "gpu")
        staging = root.join("var/lib/gpuop/staging")

        async with agent_process(nats_server, root, config, log) as first:
            await wait_until(lambda: any(component_dir.glob(".staging-*")), "the unpacked package")
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert list(staging.iterdir()), "the download is left in staging"
        assert_old_driver_running(root)
        assert NEW not in packages.installed_versions(root, KERNEL, "gpu")
        state = json.loads(root.join("var/lib/gpuop/driver-state.json").read_text())
        assert state["commands"]["install-1"]["status"] == "started"
        assert await result_of(bus, "install-1", timeout=0.2) is None

        config.write_text(f"kernel: simulated\nack_wait_seconds: 1\n{TRUST}")
        async with agent_process(nats_server, root, config, log) as second:
            answer = await result_of(bus, "install-1", timeout=30)
            assert answer is not None, log.read_text()
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 10) == 0

        envelope, result = answer
        assert isinstance(result, dm.DriverInstalled) and result.version == NEW
        assert (envelope.causationid, envelope.correlationid) == ("install-1", SAGA)
        answers = [e for e, _ in await driver_events(bus) if e.causationid == "install-1"]
        assert [e.id for e in answers] == [agents.result_id("install-1")]
        assert packages.installed_versions(root, KERNEL, "gpu") == (OLD, NEW)
        assert not list(component_dir.glob(".staging-*")) and not list(staging.iterdir())
        assert_old_driver_running(root)
        record = json.loads(root.join("var/lib/gpuop/driver-state.json").read_text())
        assert record["commands"]["install-1"]["status"] == "done"
        assert record["commands"]["install-1"]["attempts"] == 2
        assert "removed what an interrupted install left" in log.read_text()
    finally:
        await bus.close()
