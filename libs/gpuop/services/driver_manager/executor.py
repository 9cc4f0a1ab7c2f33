"""One driver command in, one result event out: what each verb does on this host.

`agent.CommandAgent` calls `context_for` when a command starts (its answer is recorded, so a
run resumed after a crash reports what the first run saw) and `execute` to run it. Every
failure the host can cause becomes the verb's failure event (`answers`) with a reason; only
bugs and bus trouble raise.

    stage     fetch, verify, check the modules, keep        DriverStaged / DriverStageFailed
    unload    count devices, unload in dependency order    DriverUnloaded / DriverUnloadFailed
    install   fetch, verify, stage, rename, depmod;         DriverInstalled / DriverInstallFailed
              the same for the host's other kernels (prestaging)
    load      select the version, depmod, modprobe, check,  DriverLoaded / DriverLoadFailed
              put the recorded MIG layout back (`mig`),
              write the CDI spec (`cdi`)
    validate  the recorded MIG layout back (after a reboot), DriverValidated / ...ValidationFailed
              NVML (GPU) or sysfs (OFED): version, devices
    rollback  install if missing, unload, load the version, DriverRolledBack / ...RollbackFailed
              the recorded MIG layout back,
              restore its CDI spec (`cdi`),
              uninstall the version rolled back from; the
              other kernels get their version from before
              pre-staging again (prestaging.restore)
    reboot    RebootStarted, then reboot                    RebootStarted
    configure-runtime  the `nvidia` handler's drop-in,       RuntimeConfigured /
              restart, answer or undo (`runtimes`)          RuntimeConfigureFailed
    apply-mig-layout  refuse busy GPUs, carve, read back;   MigLayoutApplied /
              restore on failure; CDI spec again (`mig`)    MigLayoutFailed
    reset-gpu  each GPU alone, or a driver reload          GpuReset / GpuResetFailed
              (`resetting`)

A reboot's `Outcome` carries the reboot as `after`: the agent publishes `RebootStarted`
first, then reboots; before either it asks `rebooted_since` (the boot id guard). A rollback
unloads without the management-interface check: it follows an unload the orchestrator
already opted into in the same maintenance window.

`execute` finds each command's handler in one table (`Executor._handlers`, command type to
handler). The recorded MIG layout goes back in one place (`_layout_back`): a load and a
rollback come up through `_bring_up` (load, layout, CDI spec), a validation puts it back
before it checks, a reset after it, and the agent's start once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuop.events import Command, Event, remediation_commands
from gpuop.events import driver as dm
from gpuop.events.mig_commands import ApplyMigLayout
from gpuop.host import packages, system
from gpuop.host.errors import HostError
from gpuop.host.protocol import Rebooter
from gpuop.host.resets import FunctionResets, SysfsFunctionResets
from gpuop.host.restarting import SystemdRuntimeService
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import answers, prestaging
from gpuop.services.driver_manager.answers import ComponentCommand
from gpuop.services.driver_manager.cdi import SpecFailed, SpecWriter
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.driver_manager.installing import (
    Installer,
    InstallError,
    installed_flavour,
    running_kernel,
    serves,
)
from gpuop.services.driver_manager.mig import MigApplier, ReapplyFailed
from gpuop.services.driver_manager.reloading import LoadError, Reloader, UnloadError
from gpuop.services.driver_manager.resetting import GpuResetter
from gpuop.services.driver_manager.runtimes import RuntimeConfigurer
from gpuop.services.driver_manager.state import ComponentRecord, StepContext
from gpuop.services.driver_manager.validating import ValidationFailed, Validator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What a command came to."""

    result: Event
    """The answer."""
    changes: dict[str, Any] = field(default_factory=dict)
    """Updates to the component's record."""
    after: Callable[[], Awaitable[None]] | None = None
    """Run after the result is published (the reboot itself)."""


@dataclass(frozen=True)
class _Up:
    """A load's or a rollback's way up (`Executor._bring_up`)."""

    loaded: tuple[str, ...]
    changes: dict[str, Any]
    failure: LoadError | None = None
    """The MIG layout or the CDI spec not back: the driver runs without them."""


_Handler = Callable[[str, Any, StepContext, ComponentRecord], Awaitable[Outcome]]
"""A verb's handler: the command's id, the command, what it saw first, its component's record."""

_OTHER = dm.LoadFailureReason.OTHER


class Executor:
    """Runs driver commands on one host."""

    def __init__(
        self,
        root: HostRoot,
        config: DriverManagerConfig,
        installer: Installer,
        reloader: Reloader,
        validator: Validator,
        rebooter: Rebooter,
        specs: SpecWriter | None = None,
        runtimes: RuntimeConfigurer | None = None,
        resets: FunctionResets | None = None,
    ) -> None:
        self.root = root
        self.config = config
        self.installer = installer
        self.reloader = reloader
        self.validator = validator
        self.rebooter = rebooter
        # the validator's NVML, asked only when a spec is written
        self.specs = specs or SpecWriter(root, lambda: validator.nvml(), installer.clock)
        self.runtimes = runtimes or RuntimeConfigurer(
            root, SystemdRuntimeService(root), installer.clock
        )
        self.mig = MigApplier(
            lambda: validator.nvml(),
            self.specs,
            lambda: reloader.loaded_version(dm.Component.GPU),
            root,
        )
        self.resetter = GpuResetter(
            root,
            reloader,
            lambda: validator.nvml(),
            resets or SysfsFunctionResets(root),
            after_reset=self._layout_back,
        )
        self._handlers: dict[type[Command], _Handler] = {
            dm.StageDriver: self._stage,
            dm.UnloadDriver: self._unload,
            dm.InstallDriver: self._install,
            dm.LoadDriver: self._load,
            dm.ValidateDriver: self._validate,
            dm.RollbackDriver: self._rollback,
            dm.RebootNode: self._reboot,
            dm.ConfigureRuntime: self._configure_runtime,
            ApplyMigLayout: self._apply_mig_layout,
            remediation_commands.ResetGpu: self._reset_gpu,
        }
        """Each command type's handler: the verbs of the module's table."""

    async def context_for(self, command: Command) -> StepContext:
        """What the command must remember from before it changed anything."""
        if isinstance(command, remediation_commands.ResetGpu):
            return await self.resetter.context()
        if not isinstance(command, dm.UnloadDriver | dm.RollbackDriver):
            return StepContext()
        if command.component not in self.config.components:
            return StepContext()
        present = await self.reloader.loaded_modules(command.component)
        devices = None
        if isinstance(command, dm.UnloadDriver) and present:
            devices = await self.validator.count_devices(command.component)
        return StepContext(
            from_version=self.reloader.loaded_version(command.component),
            modules=present,
            devices=devices,
        )

    def rebooted_since(self, command: dm.RebootNode) -> bool:
        """The boot id guard: the node booted again since the reboot was decided, so the
        command is answered already (by discovery's new boot id) and must not act."""
        current = system.boot_id(self.root)
        return current is not None and current != command.boot_id

    async def execute(
        self, command_id: str, command: Command, context: StepContext, record: ComponentRecord
    ) -> Outcome:
        """`command` by its verb's handler (`_handlers`). A component's command is answered
        `not managed here` for a component this agent does not manage, a host error becomes
        its retryable failure, and its outcome carries the component's packages after it."""
        handler = self._handlers.get(type(command))
        if handler is None:
            raise TypeError(f"{type(command).__name__} is not a driver command")
        if not isinstance(command, ComponentCommand):
            return await handler(command_id, command, context, record)
        if command.component not in self.config.components:
            managed = ", ".join(self.config.components)
            message = f"{command.component} is not managed here (this agent manages: {managed})"
            return Outcome(answers.failure(command_id, command, message))
        try:
            outcome = await handler(command_id, command, context, record)
        except HostError as exc:
            failure = answers.failure(command_id, command, f"host error: {exc}", retryable=True)
            outcome = Outcome(failure)
        changes = {**self._snapshot(command.component), **outcome.changes}
        return Outcome(outcome.result, changes, outcome.after)

    async def _reboot(
        self, command_id: str, command: dm.RebootNode, context: StepContext, record: ComponentRecord
    ) -> Outcome:
        started = dm.RebootStarted(command_id=command_id, boot_id=command.boot_id)
        return Outcome(started, after=self.rebooter.reboot)

    async def _configure_runtime(
        self,
        command_id: str,
        command: dm.ConfigureRuntime,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        return Outcome(await self.runtimes.configure(command_id, command))

    async def _apply_mig_layout(
        self,
        command_id: str,
        command: ApplyMigLayout,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        return Outcome(await self.mig.apply(command_id, command))

    async def _reset_gpu(
        self,
        command_id: str,
        command: remediation_commands.ResetGpu,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        return Outcome(await self.resetter.reset(command_id, command, context))

    async def _load(
        self, command_id: str, command: dm.LoadDriver, context: StepContext, record: ComponentRecord
    ) -> Outcome:
        try:
            up = await self._bring_up(
                command.component,
                command.version,
                record,
                command.timeout_seconds,
                self.specs.after_load,
                command.parameters,
            )
        except LoadError as exc:
            return Outcome(answers.load_failed(command_id, command, exc))
        if up.failure is not None:
            return Outcome(answers.load_failed(command_id, command, up.failure), up.changes)
        answer = dm.DriverLoaded(
            command_id=command_id,
            component=command.component,
            version=command.version,
            modules=up.loaded,
            parameters=up.changes.get("parameters", {}),
        )
        return Outcome(answer, up.changes)

    async def _validate(
        self,
        command_id: str,
        command: dm.ValidateDriver,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        expected = command.expected_devices
        if expected is None:
            expected = record.devices
        try:
            # after a reboot the driver came up with the MIG mode and no instances
            await self._mig_back(command.component, command.timeout_seconds, spec=True)
        except LoadError as not_back:
            unusable = ValidationFailed(
                not_back.reason, not_back.message, retryable=not_back.retryable
            )
            return Outcome(answers.validation_failed(command_id, command, unusable))
        try:
            devices = await self.validator.validate(
                command.component,
                command.version,
                expected,
                command.timeout_seconds,
                command.check,
            )
        except ValidationFailed as exc:
            return Outcome(answers.validation_failed(command_id, command, exc))
        validated = dm.DriverValidated(
            command_id=command_id,
            component=command.component,
            version=command.version,
            devices=devices,
        )
        return Outcome(validated)

    async def _unload(
        self,
        command_id: str,
        command: dm.UnloadDriver,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        try:
            removed = await self.reloader.unload(
                command.component, command.timeout_seconds, command.allow_management_interface
            )
        except UnloadError as exc:
            return Outcome(answers.unload_failed(command_id, command, exc))
        changes: dict[str, Any] = {}
        if context.modules:
            changes["modules"] = context.modules
        if context.devices is not None:
            changes["devices"] = context.devices
        if context.from_version is not None:
            changes["loaded"] = context.from_version
        # a resumed unload finds the modules gone: report what the first run removed
        reported = removed or tuple(reversed(context.modules))
        unloaded = dm.DriverUnloaded(
            command_id=command_id,
            component=command.component,
            version=context.from_version,
            modules=reported,
        )
        return Outcome(unloaded, changes)

    async def _stage(
        self,
        command_id: str,
        command: dm.StageDriver,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        try:
            async with asyncio.timeout(command.timeout_seconds):
                staged = await self.installer.stage(
                    command.component, command.version, command.source, command.flavour
                )
        except InstallError as exc:
            return Outcome(
                answers.stage_failed(command_id, command, exc.reason, exc.message, exc.retryable)
            )
        except TimeoutError:
            message = f"staging did not finish within {command.timeout_seconds} s"
            return Outcome(
                answers.stage_failed(
                    command_id, command, dm.InstallFailureReason.OTHER, message, True
                )
            )
        answer = dm.DriverStaged(
            command_id=command_id,
            component=command.component,
            version=command.version,
            sha256=staged.sha256,
        )
        return Outcome(answer)

    async def _install(
        self,
        command_id: str,
        command: dm.InstallDriver,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        try:
            async with asyncio.timeout(command.timeout_seconds):
                installed = await self.installer.install(
                    command.component, command.version, command.source, command.flavour
                )
        except InstallError as exc:
            return Outcome(
                answers.install_failed(command_id, command, exc.reason, exc.message, exc.retryable)
            )
        except TimeoutError:
            message = f"the install did not finish within {command.timeout_seconds} s"
            return Outcome(
                answers.install_failed(
                    command_id, command, dm.InstallFailureReason.OTHER, message, True
                )
            )
        staged = await prestaging.prestage(
            self.installer, command.component, command.version, command.source, command.flavour
        )
        changes: dict[str, Any] = {
            "prestaged": prestaging.recorded(staged, command.version, record.prestaged)
        }
        if installed.sha256 is not None:
            changes["packages"] = {**record.packages, command.version: installed.sha256}
        answer = dm.DriverInstalled(
            command_id=command_id,
            component=command.component,
            version=command.version,
            sha256=installed.sha256 or record.packages.get(command.version),
            flavour=dm.Flavour(installed.flavour) if installed.flavour else None,
            prestaged_kernels=staged.ready[:32],
            kernels_without_package=tuple(sorted(staged.missing))[:32],
        )
        return Outcome(answer, changes)

    async def _load_version(
        self,
        component: dm.Component,
        version: str,
        record: ComponentRecord,
        timeout: float,
        options: Mapping[str, Mapping[str, str]],
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Load `version` with the modules `record` remembers, each with its `options`; the
        modules loaded and the record's changes (`previous` becomes the version that ran
        before, if another; `parameters` what the modules show of `options`)."""
        wanted = record.modules or self.config.modules_to_load(component)
        try:
            async with asyncio.timeout(timeout):
                loaded = await self.reloader.load(component, version, wanted, options)
        except TimeoutError:
            raise LoadError(
                dm.LoadFailureReason.TIMEOUT,
                f"loading {component} {version} did not finish within {timeout} s",
                retryable=True,
            ) from None
        if self.config.load_pause_seconds:
            pause = self.config.load_pause_seconds
            log.warning("pausing %.1f s after the load, before answering (fault injection)", pause)
            await self.installer.clock.sleep(pause)
        changes: dict[str, Any] = {
            "loaded": version,
            "parameters": self.reloader.parameters_shown(options),
        }
        if record.loaded not in (None, version):
            changes["previous"] = record.loaded
        return loaded, changes

    async def _rollback(
        self,
        command_id: str,
        command: dm.RollbackDriver,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        component, version = command.component, command.version

        def failed(step: dm.DriverStep, message: str, retryable: bool) -> Outcome:
            return Outcome(answers.rollback_failed(command_id, command, step, message, retryable))

        kernel_release = running_kernel(self.root)
        installed = version in packages.installed_versions(self.root, kernel_release, component)
        flavour = command.flavour.value if command.flavour is not None else None
        if not installed or not serves(
            installed_flavour(packages.package_dir(self.root, kernel_release, component, version)),
            flavour,
        ):
            source = command.source or self.config.driver_source
            if source is None:
                message = f"{component} {version} is not installed and no driver source is known"
                if installed:
                    message = f"{component} {version} is installed with other kernel modules "
                    message += f"than {flavour} and no driver source is known"
                return failed(dm.DriverStep.INSTALL, message, False)
            try:
                async with asyncio.timeout(command.timeout_seconds):
                    await self.installer.install(component, version, source, flavour)
            except InstallError as exc:
                return failed(dm.DriverStep.INSTALL, exc.message, exc.retryable)
            except TimeoutError:
                return failed(dm.DriverStep.INSTALL, "the install timed out", True)
        try:
            await self.reloader.unload(component, command.timeout_seconds, True)
        except UnloadError as exc:
            return failed(dm.DriverStep.UNLOAD, exc.message, exc.retryable)
        updates: dict[str, Any] = {}
        if context.from_version not in (None, version):
            updates["loaded"] = context.from_version
        if context.modules:
            updates["modules"] = context.modules
        try:
            up = await self._bring_up(
                component,
                version,
                record.model_copy(update=updates),
                command.timeout_seconds,
                self.specs.after_rollback,
                command.parameters,
            )
        except LoadError as exc:
            return failed(dm.DriverStep.LOAD, exc.message, exc.retryable)
        if up.failure is not None:
            return failed(dm.DriverStep.LOAD, up.failure.message, up.failure.retryable)
        if context.from_version not in (None, version):
            # the rejected build goes: a retry fetches the package again, fixed or not
            self.installer.remove(component, context.from_version)
        # and the other kernels do not boot it either
        others = await prestaging.restore(self.installer, component, version, record.prestaged)
        answer = dm.DriverRolledBack(
            command_id=command_id,
            component=component,
            version=version,
            from_version=context.from_version,
            restored_kernels=others.restored[:32],
            kernels_not_restored=tuple(sorted(others.not_restored))[:32],
        )
        return Outcome(answer, {**updates, **up.changes, "prestaged": others.kept})

    async def _bring_up(
        self,
        component: dm.Component,
        version: str,
        record: ComponentRecord,
        timeout: float,
        write_spec: Callable[[dm.Component, str, float], Awaitable[None]],
        options: Mapping[str, Mapping[str, str]],
    ) -> _Up:
        """A load's and a rollback's way up: `version` loaded (`_load_version`; `LoadError`
        when it is not), the GPU's MIG layout put back, then its CDI spec (`write_spec`:
        written afresh, or restored by a rollback). A layout or spec not back is the
        outcome's `failure`: the driver runs, and its record's changes stand."""
        loaded, changes = await self._load_version(component, version, record, timeout, options)
        try:
            await self._mig_back(component, timeout, spec=False)
            await write_spec(component, version, timeout)
        except LoadError as exc:
            return _Up(loaded, changes, exc)
        except SpecFailed as exc:
            return _Up(loaded, changes, LoadError(_OTHER, exc.message, retryable=exc.retryable))
        return _Up(loaded, changes)

    async def catch_up_mig(self, timeout: float) -> None:
        """At start: the recorded MIG layout back if the GPU driver runs without it (the node
        rebooted while no saga was about to validate it); a failure is logged, the next
        load, validation or reset reports it."""
        if dm.Component.GPU not in self.config.components:
            return
        if self.reloader.loaded_version(dm.Component.GPU) is None:
            return
        not_back = await self._layout_back(timeout)
        if not_back is not None:
            log.error("at start: %s", not_back)

    async def _mig_back(self, component: dm.Component, timeout: float, *, spec: bool) -> None:
        """The GPU driver's MIG layout as recorded before it was unloaded, for a load, a
        rollback and a validation; `LoadError` when it cannot be put back. Only the GPU
        driver has one."""
        if component is not dm.Component.GPU:
            return
        not_back = await self._layout_back(timeout, spec=spec)
        if not_back is not None:
            log.error("%s", not_back)
            raise LoadError(_OTHER, not_back, retryable=True)

    async def _layout_back(self, timeout: float, *, spec: bool = True) -> str | None:
        """The one place the recorded MIG layout goes back (`mig.reapply`), after a load, a
        rollback, a reboot (validation, start) or a reset; why it could not, or None."""
        try:
            await self.mig.reapply(timeout, spec=spec)
        except ReapplyFailed as exc:
            return exc.message
        return None

    def _snapshot(self, component: str) -> dict[str, Any]:
        try:
            kernel_release = running_kernel(self.root)
        except InstallError:
            return {}
        return {
            "installed": packages.installed_versions(self.root, kernel_release, component),
            "active": packages.active_version(self.root, kernel_release, component),
        }
