"""The device-API switch run by the orchestrator: its `SagaKind`, and what starts one.

`DEVICE_API_SWITCH` hands the runner the pure kind (`gpuop.saga.device_api`): records under
`device-api.<node>` in `gpuop_sagas`, the fold (`gpuop.saga.device_api.folding`), its
outputs. `Starter` is its starting hook, given every event of the intake before the runner
decides it, under the node's lock, and `reconcile`, which the controller calls on each of
its reconciles (a change of the policy, of a node, or the resync). On the node's device
plugin's `DeviceApiApplied`, the node watch's `NodeObserved`, and each reconcile, it
compares the API the policy wants for the node (`GPUClusterPolicySpec.device_api_for` its
labels: its driver pool's `deviceAPI`, else the top-level one) with the one the node serves
(its latest `DeviceApiApplied`; none: the device plugin API, which a node serves until told
otherwise) and, when they differ and no switch runs there, starts one: stored
(compare-and-set), recorded as `DeviceApiSwitchStarted` (which `gpuop replay` builds the
same saga from, without the labels or the plugin's history), and its first decision carried
out (it waits for admission).

A switch that failed is not started again for the same API by itself (the node would be
drained again on every resync): the next change of the policy for the node, or of what its
device plugin serves, starts the next one. A leader that takes over records the start of a
saga its predecessor stored and died before recording (`record_start`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime

from gpuop.bus import Bus, BusError
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import Event, MalformedMessage, UnknownEventType, decode_on, ids, kube, subjects
from gpuop.events.device_api import DeviceApiState
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.saga.device_api import folding, kind, records
from gpuop.saga.device_api.records import DeviceApiSaga
from gpuop.saga.kinds import SagaKind
from gpuop.services.upgrade_orchestrator.kinds import (
    KindRunner,
    StartRecorder,
    is_a_node,
    store_new,
)
from gpuop.services.upgrade_orchestrator.publishing import Publisher
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore

log = logging.getLogger(__name__)

DEVICE_API_SWITCH: SagaKind[DeviceApiSaga] = folding.KIND
"""The device-API switch as the runtime runs it."""


def no_labels(node: str) -> Mapping[str, str]:
    """The labels of a node no watch knows: none (only the top-level `deviceAPI` applies)."""
    return {}


async def served(bus: Bus, node: str) -> DeviceApiApplied | None:
    """The node's device plugin's latest `DeviceApiApplied` in the log, if any."""
    subject = subjects.event_subject(
        DeviceApiApplied.DOMAIN, node, DeviceApiApplied.NAME, prefix=bus.prefix
    )
    found = await bus.last(subject)
    if found is None:
        return None
    try:
        _, payload = decode_on(found.subject, found.data)
    except (MalformedMessage, UnknownEventType):
        return None
    return payload if isinstance(payload, DeviceApiApplied) else None


class Starter:
    """Starts switches where the policy and the node differ (see the module docstring)."""

    def __init__(
        self,
        runner: Runner,
        store: SagaStore[DeviceApiSaga],
        *,
        labels: Callable[[str], Mapping[str, str]] = no_labels,
        clock: Clock = SYSTEM_CLOCK,
        known: Callable[[str], bool] = is_a_node,
    ) -> None:
        self._runner = runner
        self._store = store
        self._labels = labels
        """The node's labels as the node watch last saw them (a pool's selector may name
        any label; `NodeObserved` carries gpuop's only)."""
        self._known = known
        self._served: dict[str, DeviceApi] = {}
        """Per node, the API its device plugin last said it serves."""
        self._publish = Publisher(runner.bus, clock)
        self._recorder = StartRecorder(runner.bus, self._publish)

    def runner(self) -> KindRunner[DeviceApiSaga]:
        return KindRunner(DEVICE_API_SWITCH, self._store, self, self.record_start)

    async def __call__(self, node: str, event: Event, now: datetime, cause: str | None) -> None:
        """Before the runner decides `event`: start a switch if the node serves another API
        than the policy wants for it."""
        if not isinstance(event, DeviceApiApplied | kube.NodeObserved) or not self._known(node):
            return
        if isinstance(event, DeviceApiApplied):
            self._served[node] = event.api
        labels = self._labels(node)
        if not labels and isinstance(event, kube.NodeObserved):
            labels = event.labels
        await self._compare(node, labels, now, cause)

    async def reconcile(self, labels: Mapping[str, Mapping[str, str]], now: datetime) -> None:
        """Start a switch on each node of `labels` (the node watch's) whose API differs from
        the policy's: the controller calls it on every reconcile, so a change of the policy
        or of a node's labels (its pool) reaches every node without an event of its own."""
        for node, node_labels in list(labels.items()):
            try:
                await self._compare(node, node_labels, now, None)
            except BusError as error:  # the next reconcile looks again; the others go on
                log.info("cannot compare the device API of %s yet: %s", node, error)

    async def _compare(
        self, node: str, labels: Mapping[str, str], now: datetime, cause: str | None
    ) -> None:
        policy = self._runner.policy()
        if policy is None:
            return
        existing = self._store.cached(node)
        if existing is not None and not DEVICE_API_SWITCH.ended(existing.saga):
            return
        wanted = policy.device_api_for(labels)
        previous = await self._served_by(node)
        if previous is wanted:
            return
        if existing is not None and _failed_to(existing.saga, wanted, previous):
            return
        source = "its driver pool's" if policy.driver.pool_for(labels) else "the policy's"
        reason = f"{source} deviceAPI wants {wanted}; the node serves {previous}"
        await self._start(node, wanted, previous, reason, now, cause)

    async def _served_by(self, node: str) -> DeviceApi:
        """What the node's device plugin last said it serves (read from the log once per
        leader, then kept from its answers); the device plugin API when it said nothing."""
        if node not in self._served:
            latest = await served(self._bus, node)
            self._served[node] = DeviceApi.DEVICE_PLUGIN if latest is None else latest.api
        return self._served[node]

    @property
    def _bus(self) -> Bus:
        return self._runner.bus

    async def record_start(self, saga: DeviceApiSaga) -> None:
        """Publish the `DeviceApiSwitchStarted` of a saga whose first leader stored it and
        died before recording it, rebuilt from the record while it waits for its admission,
        under the same id."""
        if saga.sequence:
            return
        await self._recorder.record(saga, folding.start_of(saga), saga.saga_id, saga.step_started)

    async def _start(
        self,
        node: str,
        api: DeviceApi,
        previous: DeviceApi,
        reason: str,
        now: datetime,
        cause: str | None,
    ) -> None:
        policy = self._runner.policy()
        if policy is None:
            return
        seed = cause or ids.step(f"device-api/{node}", api.value, int(now.timestamp()))
        saga = records.new_saga(
            node=node, cause=seed, api=api, previous=previous, now=now, reason=reason
        )
        first = kind.begin(saga, policy, now)
        started = folding.start_of(saga)
        if not await store_new(self._store, self._publish, first.saga, started, now, cause):
            return
        log.info("switching %s from %s to %s", node, previous, api, extra={"node": node})
        await self._runner.act(self.runner(), first)


def _failed_to(saga: DeviceApiSaga, api: DeviceApi, previous: DeviceApi) -> bool:
    """Whether `saga` is a failed switch from `previous` to `api`: the same one again."""
    failed = saga.state is DeviceApiState.FAILED
    return failed and (saga.api, saga.previous) == (api, previous)


__all__ = ["DEVICE_API_SWITCH", "Starter", "served"]
