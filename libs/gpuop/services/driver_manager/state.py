"""The driver-manager's durable memory on the host: `<host root>/var/lib/gpuop/driver-state.json`.

Written by `agent.CommandAgent` around every command, read at start and on each delivery:

    commands    one record per command id: `started` when the agent begins it (with what
                a resumed run must know, such as the version loaded before an unload),
                `done` with the result envelope once answered. A redelivered command whose
                record is done republishes that envelope and does nothing else; one found
                `started` (the agent died in the middle) is run again, each step being safe
                to repeat.
    components  per driver stack: the version this agent last loaded and the one before it
                (what a rollback returns to), the modules that were loaded and the devices
                seen before the last unload (what a load restores and a validation expects),
                the digest of each package it installed, and per other kernel the
                version pre-staging made active there and the one active before.
    Each answer also copies the installed and the active versions from disk (for operators;
    the directories and the `active` file stay the truth).

Each write replaces the whole file in one rename (a reader never sees half of it), and
`StateLock` keeps a second agent on the same host (an overlapping DaemonSet rollout) from
acting at the same time. Records are frozen models; `StateStore` is the only writer.
"""

from __future__ import annotations

import enum
import fcntl
import os
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuop.events import Envelope
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

STATE_FILE = "var/lib/gpuop/driver-state.json"
LOCK_FILE = "var/lib/gpuop/driver-state.lock"
FORMAT: Final = "gpuop-driver-state/1"
MAX_FINISHED = 512
"""Finished command records kept; older ones are dropped, oldest first. The orchestrator
never re-issues a command that old (its retries get new ids)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class CommandStatus(enum.StrEnum):
    """Where one command stands on this host."""

    STARTED = "started"
    """Begun and not answered: the agent died in the middle if no handler runs it now; the
    next delivery runs it again."""
    DONE = "done"
    """Answered; `result` holds the envelope to republish on a redelivery."""


class StepContext(_Frozen):
    """What a command saw when it started, so a resumed run reports the same facts."""

    from_version: str | None = None
    """Version loaded when an unload or a rollback began."""
    modules: tuple[str, ...] = ()
    """Modules loaded when an unload or a rollback began, in load order."""
    devices: int | None = None
    """Devices the driver saw when an unload began."""


class CommandRecord(_Frozen):
    """One command's progress on this host."""

    verb: str
    status: CommandStatus
    started: datetime
    attempts: int = 1
    """How many times the agent began it (more than one after a crash)."""
    finished: datetime | None = None
    context: StepContext = StepContext()
    result: dict[str, Any] | None = None
    """The answer as a JSON envelope; None for a reboot dropped by the boot id guard."""

    def result_envelope(self) -> Envelope | None:
        return None if self.result is None else Envelope.model_validate(self.result)


class PrestagedKernel(_Frozen):
    """One other kernel's pre-staging, as a rollback must undo it."""

    version: str
    """The version pre-staging installed and made active for the kernel."""
    prior: str | None = None
    """The version active for the kernel before, or None when it had none."""


class ComponentRecord(_Frozen):
    """What this agent did to one driver stack."""

    loaded: str | None = None
    """Version last seen running: what an unload removed, or what a load loaded."""
    previous: str | None = None
    """Version that ran before the one loaded last: where a rollback goes."""
    parameters: dict[str, dict[str, str]] = Field(default_factory=dict)
    """The parameters the last load asked for, module to `{name: value}` as the modules
    showed them: what the node runs with."""
    modules: tuple[str, ...] = ()
    """Modules loaded before the last unload, in load order; a load restores this set."""
    devices: int | None = None
    """Devices the driver saw before the last unload; a validation expects as many."""
    packages: dict[str, str] = Field(default_factory=dict)
    """Version -> sha256 of each package this agent installed."""
    installed: tuple[str, ...] = ()
    """Versions installed for the running kernel when the last command finished."""
    active: str | None = None
    """Active version (the one depmod indexes) when the last command finished."""
    prestaged: dict[str, PrestagedKernel] = Field(default_factory=dict)
    """Kernel -> what pre-staging made active there and what was active before: what a
    rollback restores on the host's other kernels (`prestaging.restore`)."""


class DriverState(_Frozen):
    """The whole file."""

    format: Literal["gpuop-driver-state/1"] = FORMAT
    commands: dict[str, CommandRecord] = Field(default_factory=dict)
    components: dict[str, ComponentRecord] = Field(default_factory=dict)

    def component(self, name: str) -> ComponentRecord:
        return self.components.get(name, ComponentRecord())


class StateCorrupt(RuntimeError):
    """The state file exists but is not a driver state; the agent refuses to guess."""


class StateStore:
    """Reads and replaces the state file of one host root."""

    def __init__(self, root: HostRoot) -> None:
        self.path = root.join(STATE_FILE)
        self._state: DriverState | None = None

    def load(self) -> DriverState:
        if self._state is None:
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                self._state = DriverState()
            else:
                try:
                    self._state = DriverState.model_validate_json(text)
                except ValidationError as exc:
                    raise StateCorrupt(f"{self.path}: {exc.errors()[0]['msg']}") from None
        return self._state

    def command(self, command_id: str) -> CommandRecord | None:
        return self.load().commands.get(command_id)

    def start(self, command_id: str, verb: str, context: StepContext) -> CommandRecord:
        """Record that `command_id` begins (again); a resumed command keeps its context."""
        state = self.load()
        earlier = state.commands.get(command_id)
        if earlier is not None and earlier.status is CommandStatus.STARTED:
            record = earlier.model_copy(update={"attempts": earlier.attempts + 1})
        else:
            record = CommandRecord(
                verb=verb, status=CommandStatus.STARTED, started=_now(), context=context
            )
        self._write(state, commands={**state.commands, command_id: record})
        return record

    def finish(
        self,
        command_id: str,
        result: Envelope | None,
        component: str | None = None,
        changes: dict[str, Any] | None = None,
    ) -> None:
        """Record `command_id`'s answer, and in the same write what it changed in
        `component`'s record."""
        state = self.load()
        record = state.commands.get(command_id) or CommandRecord(
            verb="unknown", status=CommandStatus.STARTED, started=_now()
        )
        done = record.model_copy(
            update={
                "status": CommandStatus.DONE,
                "finished": _now(),
                "result": None if result is None else result.model_dump(mode="json"),
            }
        )
        commands = _pruned({**state.commands, command_id: done})
        components = dict(state.components)
        if component is not None and changes:
            components[component] = state.component(component).model_copy(update=changes)
        self._write(state, commands=commands, components=components)

    def update_component(self, component: str, **changes: Any) -> None:
        state = self.load()
        record = state.component(component).model_copy(update=changes)
        self._write(state, components={**state.components, component: record})

    def _write(self, state: DriverState, **changes: Any) -> None:
        new = state.model_copy(update=changes)
        write_atomic(self.path, new.model_dump_json(indent=1) + "\n")
        self._state = new


class StateLock:
    """An exclusive `flock` on the host's driver-state lock file, held while the agent runs;
    the kernel drops it when the process dies, so a killed agent never blocks its successor."""

    def __init__(self, root: HostRoot) -> None:
        self.path = root.join(LOCK_FILE)
        self._descriptor: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if free; False while another agent holds it."""
        if self._descriptor is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        self._descriptor = descriptor
        return True

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def _pruned(commands: dict[str, CommandRecord]) -> dict[str, CommandRecord]:
    finished = [key for key, record in commands.items() if record.status is CommandStatus.DONE]
    excess = len(finished) - MAX_FINISHED
    if excess <= 0:
        return commands
    oldest = sorted(finished, key=lambda key: commands[key].finished or commands[key].started)
    dropped = set(oldest[:excess])
    return {key: record for key, record in commands.items() if key not in dropped}


def _now() -> datetime:
    return datetime.now(UTC)
