"""The driver-manager's public face for tools outside the service: the `gpuop driver`
break-glass steps (`gpuop.cli.breakglass`), which run the agent's commands on a host without
the bus, and the CLI's checks of driver sources (`gpuop.cli.coverage`, `gpuop.cli.offering`),
which read a source's index as a node reads it. The rest of the package is the service's
own; a caller outside it imports this module only, so the internals can move without it.

    open_executor   the executor for a host root, built as the service builds it
    run_recorded    one command recorded started, executed, recorded done
    state           StateStore (driver-state.json), StateLock, StateCorrupt
    staging         clean_staging, active_userspace
    sources         open_source, select, flavours_for, SourceIndex, SourceError
"""

from __future__ import annotations

from gpuop.events import Event
from gpuop.events.driver import DriverSource
from gpuop.runtime.settings import Settings
from gpuop.services.driver_manager import agent, anchors, config
from gpuop.services.driver_manager.answers import ComponentCommand
from gpuop.services.driver_manager.executor import Executor
from gpuop.services.driver_manager.installing import active_userspace, clean_staging
from gpuop.services.driver_manager.sources import (
    SourceError,
    SourceIndex,
    flavours_for,
    open_source,
    select,
)
from gpuop.services.driver_manager.state import StateCorrupt, StateLock, StateStore

__all__ = [
    "ComponentCommand",
    "Executor",
    "SourceError",
    "SourceIndex",
    "StateCorrupt",
    "StateLock",
    "StateStore",
    "active_userspace",
    "clean_staging",
    "flavours_for",
    "open_executor",
    "open_source",
    "run_recorded",
    "select",
]


def open_executor(settings: Settings, named: DriverSource | None = None) -> Executor:
    """The executor for the host root `settings` names, with the collaborators its
    `--config` file (`settings.config`; the defaults when None) asks for; trusting the
    source `named` on the command line (its URI, keys, CA) instead of the config's anchor's
    sources and keys, when given (an admin at the host, not a command on the bus)."""
    loaded = config.load(settings.config)
    if named is not None:
        loaded = loaded.model_copy(update={"trust": anchors.named_at_the_host(loaded.trust, named)})
    return agent.build_executor(settings, loaded)


async def run_recorded(
    executor: Executor,
    store: StateStore,
    command_id: str,
    command: ComponentCommand,
    *,
    node: str,
    source: str,
) -> Event:
    """`command` through the agent's path, outside the bus: recorded started in `store`,
    executed, and recorded done with what it changed; its result event."""
    answer, outcome, component = await agent.execute_recorded(
        executor,
        store,
        command_id,
        command,
        None,
        node=node,
        source=source,
        correlationid=command_id,
    )
    store.finish(command_id, answer, component, outcome.changes)
    return outcome.result
