"""The GPU remediation run by the orchestrator: its `SagaKind`, and what starts one.

`REMEDIATION` hands the runner the pure kind (`gpuop.saga.remediation`): records under
`remediation.<node>` in `gpuop_sagas`, the fold, its outputs. `Starter` is its starting hook,
given every event of the intake before the runner decides it, under the node's lock: a
health event that calls for a remediation (`kind.calls_for_remediation`) on a node without
one running starts one, unless the policy disables them or the circuit breaker
(`breaker.allows` over the starts the records keep) refuses. The start is decided here, once:
whether the node's upgrade is where a remediation folds into it
(`UpgradeState.remediation_folds_in`), the node's boot id and driver from its inventory,
and, when its latest `device.api-applied` says it serves its GPUs through DRA, each GPU's
devices in its pool (`dra_devices`: the quarantine is then of the faulty GPUs' devices, not
of the node). It is stored (compare-and-set), recorded as `RemediationStarted` (which
`gpuop replay` builds the same saga from, and checks the breaker against), and its first
state's effects (the quarantine) carried out. A start the breaker refuses is recorded as
`RemediationRefused`, with an id derived from the health event's: once per refused event,
however often it is redelivered or retried (the bus drops the copy within its duplicate
window), so `gpuop replay` refuses it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from gpuop.bus import Bus, KeyExists, KeyValue, RevisionConflict
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import Event, ids
from gpuop.events import device as dev
from gpuop.events import hardware as hw
from gpuop.events.device_api_commands import DeviceApi
from gpuop.events.remediation import (
    DOMAIN,
    TERMINAL_STATES,
    RemediationRefused,
    RemediationStarted,
)
from gpuop.inventory import dra_devices as dra_inventory
from gpuop.policy import GPUClusterPolicySpec
from gpuop.policy.conditions import Condition, condition
from gpuop.saga.kinds import SagaKind
from gpuop.saga.remediation import breaker, folding, kind, records
from gpuop.saga.remediation.records import RemediationSaga
from gpuop.services.upgrade_orchestrator import device_apis, kinds
from gpuop.services.upgrade_orchestrator.kinds import (
    KindRunner,
    StartRecorder,
    is_a_node,
)
from gpuop.services.upgrade_orchestrator.publishing import Publisher
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore

log = logging.getLogger(__name__)

KEY_PREFIX = folding.KEY_PREFIX
BREAKER_CONDITION = "RemediationBreaker"
"""The policy condition the circuit breaker sets: True while it refuses new remediations."""
REMEDIATION: SagaKind[RemediationSaga] = folding.KIND
"""The remediation as the runtime runs it."""


async def dra_devices(
    bus: Bus, node: str, inventory: hw.HardwareDiscovered | None
) -> dict[str, tuple[str, ...]]:
    """Each GPU's devices in the node's DRA pool when the node serves its GPUs through DRA
    (its latest `device.api-applied` says `dra` and serving), from its inventory; empty
    otherwise, or when either is not known (the node's quarantine then, as before DRA)."""
    if inventory is None:
        return {}
    applied = await device_apis.served(bus, node)
    if applied is None or not applied.serving or applied.api is not DeviceApi.DRA:
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for device in dra_inventory.devices_of(inventory):
        found[device.gpu_uuid] = (*found.get(device.gpu_uuid, ()), device.name)
    return found


def _slots(inventory: hw.HardwareDiscovered | None, gpu_uuid: str) -> dict[str, str]:
    """The PCI address of `gpu_uuid` where the node's last inventory lists it: a hand-over
    for new hardware is released by another GPU at that address."""
    gpus = inventory.gpus if inventory is not None else ()
    return {gpu.uuid: gpu.pci_bus_id for gpu in gpus if gpu.uuid == gpu_uuid}


class Starter:
    """Starts remediations from health events (see the module docstring)."""

    def __init__(
        self,
        runner: Runner,
        upgrades: SagaStore,
        store: SagaStore[RemediationSaga],
        inventories: KeyValue,
        *,
        clock: Clock = SYSTEM_CLOCK,
        known: Callable[[str], bool] = is_a_node,
    ) -> None:
        self._runner = runner
        self._upgrades = upgrades
        self._known = known
        """Whether a node is one of the GPU nodes the orchestrator watches: a health event
        about another (none, or a name no watched node has) starts nothing and is not put to
        the breaker, so a stray event cannot use up the hour's remediations."""
        self._store = store
        self._inventories = inventories
        self._publish = Publisher(runner.bus, clock)
        self._recorder = StartRecorder(runner.bus, self._publish)
        self._starting = asyncio.Lock()
        self.refused_at: datetime | None = None
        """When the breaker last refused a start."""

    def runner(self) -> KindRunner[RemediationSaga]:
        return KindRunner(REMEDIATION, self._store, self, self.record_start)

    async def record_start(self, saga: RemediationSaga) -> None:
        """Publish the `RemediationStarted` of a saga whose first leader stored it and died
        before recording it (a replay would have no saga to decide for): rebuilt from the
        record while it has not moved yet, under the same id (a copy the log holds within
        the duplicate window is dropped)."""
        if saga.sequence or saga.attempt > 1:
            return
        await self._recorder.record(saga, records.start_of(saga), saga.saga_id, saga.started_at)

    def starts(self) -> list[datetime]:
        return [t for stored in self._store.sagas() for t in records.starts(stored.saga)]

    async def __call__(self, node: str, event: Event, now: datetime, cause: str | None) -> None:
        if not kind.calls_for_remediation(event):
            return
        if not self._known(node):
            log.info("%s is not a GPU node the orchestrator watches: not remediated", node)
            return
        assert isinstance(event, dev.DeviceHealthChanged)
        policy = self._runner.policy()
        if policy is None or not policy.remediation.enabled:
            return
        existing = await self._store.get(node)
        if existing is not None and existing.saga.state not in TERMINAL_STATES:
            return  # the running one takes the GPU in (`kind` observes it)
        # one start decided at a time across the nodes (the runner holds only this node's
        # lock): the breaker counts every start before it, and the log records them in the
        # order they were decided, the order a replay checks them in
        async with self._starting:
            limit = folding.BREAKER.limit(policy)
            if not folding.BREAKER.allows(self.starts(), now, limit):
                await self._refuse(node, event, limit, now, cause)
                return
            await self._start(node, event, policy, now, cause, existing)

    async def _refuse(
        self, node: str, event: dev.DeviceHealthChanged, limit: int, now: datetime,
        cause: str | None,
    ) -> None:  # fmt: skip
        self.refused_at = now
        starts = self.starts()
        log.warning(
            "circuit breaker: %d remediations started in the last hour; %s not "
            "remediated", limit, node, extra={"node": node},
        )  # fmt: skip
        refused = RemediationRefused(
            unhealthy={event.gpu_uuid: (event.xid,) if event.xid is not None else ()},
            action=event.effective_action,
            starts=len(breaker.recent(starts, now)),
            max_per_hour=limit,
            reopens=breaker.reopens(starts, now, limit),
        )
        owner = cause or f"{node}/{event.gpu_uuid}/{now.isoformat()}"
        await self._publish.event(
            refused, node=node, id=ids.refused(owner), causationid=cause, now=now
        )

    async def _start(
        self,
        node: str,
        event: dev.DeviceHealthChanged,
        policy: GPUClusterPolicySpec,
        now: datetime,
        cause: str | None,
        existing: object,
    ) -> None:
        upgrade = await self._upgrades.get(node)
        folds_in = upgrade is not None and upgrade.saga.state.remediation_folds_in
        folded = upgrade.saga.saga_id if upgrade is not None and folds_in else None
        inventory = await kinds.inventory(self._inventories, node)
        devices = await dra_devices(self._runner.bus, node, inventory)
        saga_id = records.saga_id_for(node, now)
        started = RemediationStarted(
            saga_id=saga_id,
            unhealthy={event.gpu_uuid: (event.xid,) if event.xid is not None else ()},
            action=event.effective_action,
            boot_id=inventory.boot_id if inventory else None,
            driver_version=inventory.driver_version if inventory else None,
            folded_into=folded,
            dra_devices=devices,
            slots=_slots(inventory, event.gpu_uuid),
            signals={event.gpu_uuid: event.signal} if event.signal else {},
        )
        saga = folding.start(node, started, policy, now).saga  # as replay builds it
        earlier = self._store.cached(node)
        if earlier is not None:
            kept = breaker.recent(records.starts(earlier.saga), now)
            saga = saga.model_copy(update={"earlier_starts": tuple(kept)})
        try:
            if earlier is None:
                await self._store.create(saga)
            else:
                await self._store.replace(saga, earlier.revision)
        except (KeyExists, RevisionConflict):
            return  # another writer: the next health event looks again
        await self._publish.event(
            started, node=node, id=ids.started(saga_id), correlationid=saga_id,
            causationid=cause, now=now,
        )  # fmt: skip
        how = f", folded into {folded}" if folded else ""
        how += ", quarantining its devices (DRA)" if devices else ""
        log.warning("remediating %s on %s%s", event.gpu_uuid, node, how, extra={"node": node})
        await self._runner.act(self.runner(), kind.pending(saga, policy))

    def condition(self, policy: GPUClusterPolicySpec, now: datetime) -> Condition:
        """The policy's `RemediationBreaker` condition at `now`."""
        limit = policy.remediation.max_per_hour
        reopens = breaker.reopens(self.starts(), now, limit)
        if reopens is None:
            return condition(
                BREAKER_CONDITION, False, "WithinLimit",
                f"fewer than {limit} remediations started in the last hour" if limit
                else "no limit (remediation.maxPerHour: 0)",
                now=now,
            )  # fmt: skip
        return condition(
            BREAKER_CONDITION, True, "Tripped",
            f"{limit} remediations started in the last hour (remediation.maxPerHour): no "
            f"other starts until {reopens.isoformat()}",
            now=now,
        )  # fmt: skip


__all__ = ["DOMAIN", "REMEDIATION", "Starter"]
