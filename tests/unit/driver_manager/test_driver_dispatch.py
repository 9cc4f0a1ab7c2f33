"""The executor's dispatch: every command addressed to the driver-manager has a handler, and
a command of another service is a bug (a `TypeError`), not an answer."""

from __future__ import annotations

import pytest

from gpuop.clocks import VirtualClock
from gpuop.events import Command, remediation_commands
from gpuop.events import driver as dm
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import agent as agents
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.driver_manager.executor import Executor
from gpuop.services.driver_manager.state import ComponentRecord, StepContext
from tests.support.driver_manager import TRUSTED, settings_for


def _commands(base: type[Command] = Command) -> list[type[Command]]:
    found = []
    for sub in base.__subclasses__():
        found += [sub, *_commands(sub)]
    return found


def _executor(host: HostRoot) -> Executor:
    return agents.build_executor(
        settings_for(host), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    )


def test_every_driver_manager_command_has_a_handler(host: HostRoot) -> None:
    ours = {command for command in _commands() if command.SERVICE == dm.SERVICE}

    assert len(ours) == 10
    assert ours == set(_executor(host)._handlers)


async def test_a_command_of_another_service_is_not_run(host: HostRoot) -> None:
    other = remediation_commands.ListGpuHolders.model_construct()

    with pytest.raises(TypeError, match="ListGpuHolders is not a driver command"):
        await _executor(host).execute("cmd-1", other, StepContext(), ComponentRecord())
