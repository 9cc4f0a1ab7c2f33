"""The saga kinds as the runtime runs them: one `KindRunner` per kind of `KINDS`.

Every kind, the driver upgrade included, runs through one runner (`running.Runner`), one
store class (`store.SagaStore`, by the kind's key prefix), one outbox, the deadlines and the
intake; the pure kind (`gpuop.saga.kinds.SagaKind`, listed in `gpuop.saga.registry.KINDS`)
says what each needs. What this module adds is the I/O a kind's starts need:

    KindRunner  a kind with its store and its starter's hooks: `starter`, given every event
                before the runner decides it, under the node's lock (a GPU's health starts a
                remediation); `recorded`, which makes sure the log records a stored saga's
                start (called by `resume` first: a leader that stored a saga may have died
                before it published its start); `after`, given every event once the runner
                decided it (a request queued behind a saga that ended)
    StartRecorder  `recorded` as every kind writes it: the start event rebuilt from the
                record, published under its one id unless the log holds it already
    is_a_node, inventory, stored_id   what the starters share
    store_new   a starter's new saga stored with compare-and-set and its start recorded

How a kind is added: write the pure kind under `gpuop.saga.<kind>/` (kind, table, one phase
module per state, records, drafting, its `folding` with its `SagaKind`), add it to `KINDS`,
and write its starter in a module of this service (`remediations`, `migs` are the models),
whose `KindRunner` the controller builds (`Controller.kind_runners`). The runner, the
outbox, the traces and `gpuop replay` are not touched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic

from gpuop.bus import Bus, KeyExists, KeyValue, RevisionConflict
from gpuop.events import Event, ids, subjects
from gpuop.events import hardware as hw
from gpuop.saga.kinds import SagaKind
from gpuop.services.upgrade_orchestrator.indexing import R
from gpuop.services.upgrade_orchestrator.publishing import Publisher
from gpuop.services.upgrade_orchestrator.store import SagaStore

log = logging.getLogger(__name__)

Starter = Callable[[str, Event, datetime, str | None], Awaitable[None]]
"""Starts a saga of the kind on a node from an event, if the event calls for one: (node,
event, the event's time, the event's envelope id)."""


@dataclass
class KindRunner(Generic[R]):
    """A kind the runner runs: its description, its store, and its starter's hooks (see
    the module docstring)."""

    kind: SagaKind[R]
    store: SagaStore[R]
    starter: Starter | None = None
    recorded: Callable[[R], Awaitable[None]] | None = None
    after: Starter | None = None


def is_a_node(node: str) -> bool:
    """Whether an event's node names a node at all (not `_cluster`, the subject of events
    about none): what a kind's starter knows of a node before the node watch has listed
    the GPU nodes."""
    return node != subjects.CLUSTER


def envelope_id(data: bytes) -> str | None:
    """The id of a stored message's envelope, if it has one."""
    try:
        stored: object = json.loads(data)
    except ValueError:
        return None
    found = stored.get("id") if isinstance(stored, dict) else None
    return found if isinstance(found, str) else None


async def stored_id(bus: Bus, subject: str) -> str | None:
    """The envelope id of the latest message on `subject`, if any."""
    found = await bus.last(subject)
    return None if found is None else envelope_id(found.data)


async def inventory(inventories: KeyValue, node: str) -> hw.HardwareDiscovered | None:
    """The node's latest inventory in KV, if it has one that decodes."""
    entry = await inventories.get(subjects.encode_node(node))
    if entry is None:
        return None
    try:
        return hw.HardwareDiscovered.model_validate_json(entry.value)
    except ValueError:
        return None


class StartRecorder:
    """Publishes the start event of a saga whose first leader stored it and died before
    recording it (a replay would have no saga to decide for), rebuilt from the record,
    under the same id (a copy the log holds within the duplicate window is dropped)."""

    def __init__(self, bus: Bus, publisher: Publisher) -> None:
        self._bus = bus
        self._publish = publisher

    async def record(self, saga: Any, started: Event, correlation: str, at: datetime) -> None:
        """Publish `started`, the start of `saga`, at `at` unless the log holds it."""
        subject = subjects.event_subject(
            started.DOMAIN, saga.node, started.NAME, prefix=self._bus.prefix
        )
        if await stored_id(self._bus, subject) == ids.started(saga.saga_id):
            return
        log.info("recording the start of %s, which its first leader did not", saga.saga_id)
        await self._publish.event(
            started, node=saga.node, id=ids.started(saga.saga_id), correlationid=correlation,
            now=at,
        )  # fmt: skip


async def store_new(
    store: SagaStore[R],
    publish: Publisher,
    saga: R,
    started: Event,
    now: datetime,
    cause: str | None,
) -> bool:
    """Store a starter's new `saga` as its node's record of the kind (created, or replacing
    the node's ended one at the revision last read), then record its start `started`
    under its one id; False, nothing recorded, when another writer came first (the node's
    next event looks again)."""
    earlier = store.cached(saga.node)
    try:
        if earlier is None:
            await store.create(saga)
        else:
            await store.replace(saga, earlier.revision)
    except (KeyExists, RevisionConflict):
        return False
    await publish.event(
        started, node=saga.node, id=ids.started(saga.saga_id), correlationid=saga.saga_id,
        causationid=cause, now=now,
    )  # fmt: skip
    return True
