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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
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
            after_reset=self._mig_after_reset,
        )

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
        if isinstance(command, dm.RebootNode):
            started = dm.RebootStarted(command_id=command_id, boot_id=command.boot_id)
            return Outcome(started, after=self.rebooter.reboot)
        if isinstance(command, dm.ConfigureRuntime):
            return Outcome(await self.runtimes.configure(command_id, command))
        if isinstance(command, ApplyMigLayout):
            return Outcome(await self.mig.apply(command_id, command))
        if isinstance(command, remediation_commands.ResetGpu):
            return Outcome(await self.resetter.reset(command_id, command, context))
        if not isinstance(command, ComponentCommand):
            raise TypeError(f"{type(command).__name__} is not a driver command")
        if command.component not in self.config.components:
            managed = ", ".join(self.config.components)
            message = f"{command.component} is not managed here (this agent manages: {managed})"
            return Outcome(answers.failure(command_id, command, message))
        try:
            outcome = await self._run(command_id, command, context, record)
        except HostError as exc:
            failure = answers.failure(command_id, command, f"host error: {exc}", retryable=True)
            outcome = Outcome(failure)
        changes = {**self._snapshot(command.component), **outcome.changes}
        return Outcome(outcome.result, changes, outcome.after)

    async def _run(
        self,
        command_id: str,
        command: ComponentCommand,
        context: StepContext,
        record: ComponentRecord,
    ) -> Outcome:
        if isinstance(command, dm.UnloadDriver):
            return await self._unload(command_id, command, context)
        if isinstance(command, dm.StageDriver):
            return await self._stage(command_id, command)
        if isinstance(command, dm.InstallDriver):
            return await self._install(command_id, command, record)
        if isinstance(command, dm.LoadDriver):
            try:
                loaded, changes = await self._load_version(
                    command.component, command.version, record, command.timeout_seconds
                )
            except LoadError as exc:
                return Outcome(answers.load_failed(command_id, command, exc))
            try:
                await self._reapply_mig(command.component, command.timeout_seconds)
            except LoadError as exc:
                return Outcome(answers.load_failed(command_id, command, exc), changes)
            try:
                await self.specs.after_load(
                    command.component, command.version, command.timeout_seconds
                )
            except SpecFailed as exc:
                failure = LoadError(
                    dm.LoadFailureReason.OTHER, exc.message, retryable=exc.retryable
                )
                return Outcome(answers.load_failed(command_id, command, failure), changes)
            answer = dm.DriverLoaded(
                command_id=command_id,
                component=command.component,
                version=command.version,
                modules=loaded,
            )
            return Outcome(answer, changes)
        if isinstance(command, dm.ValidateDriver):
            expected = command.expected_devices
            if expected is None:
                expected = record.devices
            try:
                # after a reboot the driver came up with the MIG mode and no instances
                await self._reapply_mig(command.component, command.timeout_seconds, spec=True)
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
        return await self._rollback(command_id, command, context, record)

    async def _unload(
        self, command_id: str, command: dm.UnloadDriver, context: StepContext
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

    async def _stage(self, command_id: str, command: dm.StageDriver) -> Outcome:
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
        self, command_id: str, command: dm.InstallDriver, record: ComponentRecord
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
        self, component: dm.Component, version: str, record: ComponentRecord, timeout: float
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Load `version` with the modules `record` remembers; the modules loaded and the
        record's changes (`previous` becomes the version that ran before, if another)."""
        wanted = record.modules or self.config.modules_to_load(component)
        try:
            async with asyncio.timeout(timeout):
                loaded = await self.reloader.load(component, version, wanted)
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
        changes: dict[str, Any] = {"loaded": version}
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
            _, changes = await self._load_version(
                component, version, record.model_copy(update=updates), command.timeout_seconds
            )
        except LoadError as exc:
            return failed(dm.DriverStep.LOAD, exc.message, exc.retryable)
        try:
            await self._reapply_mig(component, command.timeout_seconds)
        except LoadError as exc:
            return failed(dm.DriverStep.LOAD, exc.message, exc.retryable)
        try:
            await self.specs.after_rollback(component, version, command.timeout_seconds)
        except SpecFailed as exc:
            return failed(dm.DriverStep.LOAD, exc.message, exc.retryable)
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
        return Outcome(answer, {**updates, **changes, "prestaged": others.kept})

    async def catch_up_mig(self, timeout: float) -> None:
        """At start: the recorded MIG layout back if the GPU driver runs without it (the node
        rebooted while no saga was about to validate it); a failure is logged, the next
        load, validation or reset reports it."""
        if dm.Component.GPU not in self.config.components:
            return
        if self.reloader.loaded_version(dm.Component.GPU) is None:
            return
        try:
            await self.mig.reapply(timeout, spec=True)
        except ReapplyFailed as exc:
            log.error("at start: %s", exc.message)

    async def _mig_after_reset(self, timeout: float) -> str | None:
        try:
            await self.mig.reapply(timeout, spec=True)
        except ReapplyFailed as exc:
            return exc.message
        return None

    async def _reapply_mig(
        self, component: dm.Component, timeout: float, *, spec: bool = False
    ) -> None:
        """The GPU driver's MIG layout as recorded before it was unloaded (`mig.reapply`);
        `LoadError` when it cannot be put back. Only the GPU driver has one."""
        if component is not dm.Component.GPU:
            return
        try:
            await self.mig.reapply(timeout, spec=spec)
        except ReapplyFailed as exc:
            log.error("%s", exc.message)
            raise LoadError(dm.LoadFailureReason.OTHER, exc.message, retryable=True) from None

    def _snapshot(self, component: str) -> dict[str, Any]:
        try:
            kernel_release = running_kernel(self.root)
        except InstallError:
            return {}
        return {
            "installed": packages.installed_versions(self.root, kernel_release, component),
            "active": packages.active_version(self.root, kernel_release, component),
        }
