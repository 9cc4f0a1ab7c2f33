"""What several MIG phases share: a deadline that fails the step, an answer to the step,
and the executor's timeout."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import StepResult, Trigger, overdue
from gpuop.saga.mig.drafting import Draft
from gpuop.saga.mig.records import MigSaga, MigStep, MigStepKind
from gpuop.saga.mig.steps import limit_seconds
from gpuop.saga.upgrade.steps import executor_timeout


def fail_on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    """Most steps' deadline: the step failed; compensate."""
    draft.fail(overdue(draft), StepResult.EXPIRED)


def answers(draft: Draft, command_id: str) -> bool:
    """Whether an answer carrying `command_id` answers the pending step."""
    return command_id == draft.step_id()


def answers_action(draft: Draft, trigger: Trigger) -> bool:
    """Whether `trigger` is the outcome of the Kubernetes action of the pending step."""
    return isinstance(trigger, kube.KubeActionResult) and trigger.action_id == draft.step_id()


def timeout(saga: MigSaga, spec: GPUClusterPolicySpec) -> int:
    """The executor's timeout for the pending step: 90% of its deadline, so it reports its
    own failure, with its reason, before the saga's deadline fails the step."""
    limit = limit_seconds(saga.step, spec.mig)
    if limit is None:
        raise ValueError(f"step {saga.step.token} has no deadline to take a timeout from")
    return executor_timeout(limit)


def start(draft: Draft, kind: MigStepKind) -> None:
    """Make a step of `kind` the pending one."""
    draft.start(MigStep(kind=kind))
