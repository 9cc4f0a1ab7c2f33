"""A driver for the device-API switch kind in tests: a node, a policy, a fake time, and the
answers each step's executor gives.

`SwitchRun` makes the saga as the runtime would (`records.new_saga`, `kind.begin`), feeds
it events through `kind.decide` with the saga each decision returns, and keeps every
decision; `ok()` answers the pending step with its success, `expire()` fires its deadline.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpuop.events import ids, kube
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied, SetDeviceApi
from gpuop.events.fields import NamespacedName
from gpuop.policy import DriverSpec, GPUClusterPolicySpec
from gpuop.policy.drivers import ComponentSpec
from gpuop.saga import machine
from gpuop.saga.device_api import kind, records
from gpuop.saga.device_api.records import DeviceApiSaga, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NODE = "gpu-node-1"
CAUSE = "0123456789abcdef0123456789abcdef"
VALIDATOR = NamespacedName(namespace="gpuop", name="gpuop-validate-gpu-node-1-0a1b2c3d")


def policy(**fields: Any) -> GPUClusterPolicySpec:
    return GPUClusterPolicySpec(driver=DriverSpec(gpu=ComponentSpec(version="580.2")), **fields)


class SwitchRun:
    """One device-API switch driven through the kind, with every decision kept."""

    def __init__(
        self,
        api: DeviceApi = DeviceApi.DRA,
        previous: DeviceApi = DeviceApi.DEVICE_PLUGIN,
        *,
        spec: GPUClusterPolicySpec | None = None,
    ) -> None:
        self.policy = spec or policy()
        self.now = T0
        saga = records.new_saga(node=NODE, cause=CAUSE, api=api, previous=previous, now=T0)
        first = kind.begin(saga, self.policy, T0)
        self.saga: DeviceApiSaga = first.saga
        self.decisions: list[kind.Decision] = [first]

    def feed(self, trigger: machine.Trigger, after: float = 1.0) -> kind.Decision:
        self.now += timedelta(seconds=after)
        decision = kind.decide(self.saga, trigger, self.policy, self.now)
        self.saga = decision.saga
        self.decisions.append(decision)
        return decision

    def expire(self) -> kind.Decision:
        expired = machine.deadline_event(self.saga)
        assert expired is not None, f"{self.saga.step.token} has no deadline"
        assert self.saga.deadline is not None
        self.now = self.saga.deadline
        return self.feed(expired, after=0)

    @property
    def state(self) -> DeviceApiState:
        return self.saga.state

    @property
    def step_id(self) -> str:
        return ids.step(self.saga.saga_id, self.saga.step.token, self.saga.attempt)

    def answer(self, api: DeviceApi, serving: bool = True, message: str = "") -> kind.Decision:
        """The device plugin's answer to the pending `SetDeviceApi`."""
        applied = DeviceApiApplied(
            api=api, serving=serving, command_id=self.step_id, message=message
        )
        return self.feed(applied)

    def ok(self, *, was_unschedulable: bool = False) -> kind.Decision:
        """Answer the pending step with its success."""
        step, step_id = self.saga.step.kind, self.step_id
        if step is SwitchStepKind.ADMISSION:
            return self.feed(machine.Admitted())
        if step is SwitchStepKind.CORDON:
            cordoned = kube.NodeCordoned(action_id=step_id, was_unschedulable=was_unschedulable)
            return self.feed(cordoned)
        if step is SwitchStepKind.DRAIN:
            return self.feed(kube.PodsDeleted(action_id=step_id, deleted=2))
        if step is SwitchStepKind.SWITCH:
            return self.answer(self.saga.api)
        if step is SwitchStepKind.SWITCH_BACK:
            return self.answer(self.saga.previous)
        if step is SwitchStepKind.VALIDATE:
            return self.feed(kube.ValidationPodSucceeded(action_id=step_id, pod=VALIDATOR))
        if step is SwitchStepKind.UNCORDON:
            return self.feed(kube.NodeUncordoned(action_id=step_id))
        raise AssertionError(f"no success answer for {step}")

    def until(self, state: DeviceApiState, limit: int = 20) -> None:
        """Answer every step with success until the saga is in `state`."""
        for _ in range(limit):
            if self.saga.state is state:
                return
            self.ok()
        raise AssertionError(f"never reached {state}: in {self.saga.state}")

    def states(self) -> list[DeviceApiState]:
        return [t.to_state for d in self.decisions for t in d.transitions]

    def actions(self) -> list[Any]:
        return [a for d in self.decisions for a in d.kube_actions]

    def commands(self) -> list[SetDeviceApi]:
        found = [c.payload for d in self.decisions for c in d.commands]
        assert all(isinstance(c, SetDeviceApi) for c in found)
        return found  # type: ignore[return-value]
