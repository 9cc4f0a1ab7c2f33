"""The failure events the executor answers with, built from what went wrong.

Every failure answer names the command and component, says what happened for operators
(`message`, bounded) and whether the same command may succeed later (`retryable`). Called
only by `executor.Executor`.
"""

from __future__ import annotations

from typing import Any

from gpuop.events import driver as dm
from gpuop.services.driver_manager.reloading import LoadError, UnloadError
from gpuop.services.driver_manager.validating import ValidationFailed

MAX_MESSAGE = 2048

ComponentCommand = (
    dm.UnloadDriver
    | dm.StageDriver
    | dm.InstallDriver
    | dm.LoadDriver
    | dm.ValidateDriver
    | dm.RollbackDriver
)
"""The commands about one driver stack (all but `RebootNode`)."""


def _common(command_id: str, command: ComponentCommand, message: str, retryable: bool) -> Any:
    return {
        "command_id": command_id,
        "component": command.component,
        "message": message[:MAX_MESSAGE],
        "retryable": retryable,
    }


def unload_failed(
    command_id: str, command: dm.UnloadDriver, error: UnloadError
) -> dm.DriverUnloadFailed:
    return dm.DriverUnloadFailed(
        **_common(command_id, command, error.message, error.retryable),
        reason=error.reason,
        holding_modules=error.holding_modules,
        holding_processes=error.holding_processes,
    )


def install_failed(
    command_id: str,
    command: dm.InstallDriver,
    reason: dm.InstallFailureReason,
    message: str,
    retryable: bool,
) -> dm.DriverInstallFailed:
    return dm.DriverInstallFailed(
        **_common(command_id, command, message, retryable), version=command.version, reason=reason
    )


def stage_failed(
    command_id: str,
    command: dm.StageDriver,
    reason: dm.InstallFailureReason,
    message: str,
    retryable: bool,
) -> dm.DriverStageFailed:
    return dm.DriverStageFailed(
        **_common(command_id, command, message, retryable), version=command.version, reason=reason
    )


def load_failed(command_id: str, command: dm.LoadDriver, error: LoadError) -> dm.DriverLoadFailed:
    return dm.DriverLoadFailed(
        **_common(command_id, command, error.message, error.retryable),
        version=command.version,
        reason=error.reason,
    )


def validation_failed(
    command_id: str, command: dm.ValidateDriver, error: ValidationFailed
) -> dm.DriverValidationFailed:
    return dm.DriverValidationFailed(
        **_common(command_id, command, error.message, error.retryable),
        version=command.version,
        reason=error.reason,
    )


def rollback_failed(
    command_id: str,
    command: dm.RollbackDriver,
    step: dm.DriverStep,
    message: str,
    retryable: bool,
) -> dm.DriverRollbackFailed:
    return dm.DriverRollbackFailed(
        **_common(command_id, command, message, retryable),
        version=command.version,
        failed_step=step,
    )


def failure(
    command_id: str, command: ComponentCommand, message: str, retryable: bool = False
) -> dm.DriverFailure:
    """The answer to `command` for a cause outside its steps (reason `other`)."""
    common = _common(command_id, command, message, retryable)
    if isinstance(command, dm.UnloadDriver):
        return dm.DriverUnloadFailed(**common, reason=dm.UnloadFailureReason.OTHER)
    if isinstance(command, dm.StageDriver):
        return stage_failed(command_id, command, dm.InstallFailureReason.OTHER, message, retryable)
    if isinstance(command, dm.InstallDriver):
        return install_failed(
            command_id, command, dm.InstallFailureReason.OTHER, message, retryable
        )
    if isinstance(command, dm.LoadDriver):
        return dm.DriverLoadFailed(
            **common, version=command.version, reason=dm.LoadFailureReason.OTHER
        )
    if isinstance(command, dm.ValidateDriver):
        return dm.DriverValidationFailed(
            **common, version=command.version, reason=dm.LoadFailureReason.OTHER
        )
    return rollback_failed(command_id, command, dm.DriverStep.UNLOAD, message, retryable)
