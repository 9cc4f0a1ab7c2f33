"""The driver upgrade's starter hooks, as `remediations` and `migs` hold theirs.

The upgrade's sagas are started by the controller's reconcile (`controller.Controller`: a
rollout selects nodes, each gets a `NodeSaga` and its recorded `SagaStarted`); what the
runner needs besides is `record_start`, the upgrade's `KindRunner.recorded`: a leader that
takes over publishes the `SagaStarted` of a saga never admitted if the log lacks it (the
leader that stored the saga died before recording its start, and without it a replay of the
log has no saga to decide for: seen in the chaos test).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import NodeSaga
from gpuop.saga.upgrade import folding
from gpuop.saga.upgrade.records import desired_targets
from gpuop.services.upgrade_orchestrator.kinds import StartRecorder

log = logging.getLogger(__name__)


class StartRecording:
    """`record_start` for the sagas of one runner, under the policy in force."""

    def __init__(
        self, recorder: StartRecorder, policy: Callable[[], GPUClusterPolicySpec | None]
    ) -> None:
        self._recorder = recorder
        self._policy = policy

    async def record_start(self, saga: NodeSaga) -> None:
        """Publish the `SagaStarted` of a saga never admitted if the log lacks it, rebuilt
        from the record as `new_saga` made it: a component it leaves out ran the policy's
        version."""
        policy = self._policy()
        if policy is None:
            return
        if saga.state is not UpgradeState.UPGRADE_REQUIRED or saga.sequence or saga.attempt > 1:
            return
        try:
            targets = desired_targets(policy, saga.pool)
        except KeyError:
            return  # its pool is gone: the next rollout replaces the untouched saga
        running = {
            component: saga.previous_versions.get(component)
            if component in saga.components
            else target.version
            for component, target in targets.items()
        }
        started = folding.start_of(saga, running)
        await self._recorder.record(saga, started, saga.rollout_id, saga.step_started)
