"""The saga index (`indexing.SagaIndex`, kept by `SagaStore`): in step with KV through the
store's own writes and its watch, rebuilt on start and after a broken watch, and never the
cause of a lost write (compare-and-set still decides)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import pytest

from gpuop.bus import (
    Buckets,
    BusError,
    InMemoryBus,
    KeyExists,
    KeyValue,
    KvEntry,
    RevisionConflict,
)
from gpuop.clocks import VirtualClock
from gpuop.events import subjects
from gpuop.events.upgrade import NodeAdmitted
from gpuop.saga import NodeStatus, admission
from gpuop.services.upgrade_orchestrator.indexing import SagaIndex, StoredSaga
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.orchestrator import Stack
from tests.support.sagas import BOOT_B, NODE, T0, S, policy, saga_for

SPEC = policy(max_parallel_upgrades=2, max_unavailable="100%")


async def until(condition: Callable[[], bool], *, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


class BreakingKeyValue:
    """A bucket whose watch can be broken by the test, as a lost connection breaks it."""

    def __init__(self, inner: KeyValue) -> None:
        self._inner = inner
        self.broken = asyncio.Event()
        self.watches = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def watch(self, pattern: str = ">") -> AsyncIterator[KvEntry | None]:
        self.watches += 1
        broken = self.broken
        entries = aiter(self._inner.watch(pattern))
        while True:
            step = asyncio.ensure_future(anext(entries))
            breaking = asyncio.ensure_future(broken.wait())
            try:
                await asyncio.wait([step, breaking], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in (step, breaking):
                    if not waiter.done():
                        waiter.cancel()
                await asyncio.gather(step, breaking, return_exceptions=True)
            if breaking.done() and not breaking.cancelled():
                self.broken = asyncio.Event()
                raise BusError("the connection to the server was lost")
            yield step.result()


class GatedClock(VirtualClock):
    """A clock whose sleeps end when the test opens the gate: the store's wait before it
    watches again lasts as long as the test needs."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sleeping = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeping += 1
        await self.gate.wait()


async def following(store: SagaStore, clock: VirtualClock | None = None) -> asyncio.Task[None]:
    clock = clock or VirtualClock()
    task = asyncio.create_task(store.follow(clock=clock), name="saga-watch")
    await asyncio.sleep(0)
    return task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def states(store: SagaStore) -> dict[str, S]:
    return {entry.saga.node: entry.saga.state for entry in store.sagas()}


async def test_the_watch_brings_another_writers_updates_and_deletes(bus: InMemoryBus) -> None:
    kv = await bus.kv(Buckets.SAGAS)
    ours, theirs = SagaStore(kv), SagaStore(kv)
    watch = await following(ours)
    try:
        created = await theirs.create(saga_for(SPEC, node="gpu-a"))
        await until(lambda: ours.cached("gpu-a") == created)
        moved = created.saga.model_copy(update={"state": S.UPGRADE_DONE})
        replaced = await theirs.replace(moved, created.revision)
        await until(lambda: ours.cached("gpu-a") == replaced)
        assert "gpu-a" in ours.index.done and ours.index.live() == []
        await kv.delete(subjects.encode_node("gpu-a"))
        await until(lambda: ours.cached("gpu-a") is None)
        assert len(ours.index) == 0 and "gpu-a" not in ours.index.done
    finally:
        await stopped(watch)


async def test_a_broken_watch_is_started_again_and_the_index_rebuilt(
    bus: InMemoryBus, caplog: pytest.LogCaptureFixture
) -> None:
    breaking = BreakingKeyValue(await bus.kv(Buckets.SAGAS))
    ours = SagaStore(breaking)  # type: ignore[arg-type]
    theirs = SagaStore(await bus.kv(Buckets.SAGAS))
    kept = await theirs.create(saga_for(SPEC, node="gpu-a"))
    gone = await theirs.create(saga_for(SPEC, node="gpu-b"))
    clock = GatedClock()
    watch = await following(ours, clock)
    try:
        await until(lambda: len(ours.index) == 2)
        with caplog.at_level(logging.WARNING):
            breaking.broken.set()
            await until(lambda: clock.sleeping == 1)
        assert "the saga watch broke" in caplog.text
        # changes while no watch runs: only the next watch's rebuild can bring them
        await theirs.replace(kept.saga.model_copy(update={"boot_id": BOOT_B}), kept.revision)
        await breaking.delete(subjects.encode_node(gone.saga.node))
        await theirs.create(saga_for(SPEC, node="gpu-c"))
        assert set(states(ours)) == {"gpu-a", "gpu-b"}  # stale meanwhile
        clock.gate.set()
        await until(lambda: set(states(ours)) == {"gpu-a", "gpu-c"})
        assert breaking.watches == 2
        found = ours.cached("gpu-a")
        assert found is not None and found.saga.boot_id == BOOT_B
    finally:
        await stopped(watch)


async def test_a_watch_that_ends_is_started_again(bus: InMemoryBus) -> None:
    kv = await bus.kv(Buckets.SAGAS)

    class EndingKeyValue(BreakingKeyValue):
        async def watch(self, pattern: str = ">") -> AsyncIterator[KvEntry | None]:
            self.watches += 1
            if self.watches == 1:
                return  # a watcher the server closed: no entries, not even the marker
            async for entry in self._inner.watch(pattern):
                yield entry

    ending = EndingKeyValue(kv)
    ours = SagaStore(ending)  # type: ignore[arg-type]
    await SagaStore(kv).create(saga_for(SPEC, node="gpu-a"))
    watch = await following(ours)
    try:
        await until(lambda: ours.cached("gpu-a") is not None)
        assert ending.watches == 2
    finally:
        await stopped(watch)


async def test_a_new_leader_rebuilds_the_index_from_kv(bus: InMemoryBus) -> None:
    kv = await bus.kv(Buckets.SAGAS)
    dead = SagaStore(kv)
    for node in ("gpu-a", "gpu-b"):
        await dead.create(saga_for(SPEC, node=node))
    done = await dead.get("gpu-b")
    assert done is not None
    await dead.replace(done.saga.model_copy(update={"state": S.UPGRADE_DONE}), done.revision)
    successor = SagaStore(kv)
    assert successor.sagas() == []
    assert await successor.load() == 2
    assert states(successor) == {"gpu-a": S.UPGRADE_REQUIRED, "gpu-b": S.UPGRADE_DONE}
    assert [e.saga.node for e in successor.index.live()] == ["gpu-a"]
    assert list(successor.index.done) == ["gpu-b"]


async def test_a_saga_that_does_not_decode_is_left_out_of_the_index(
    bus: InMemoryBus, caplog: pytest.LogCaptureFixture
) -> None:
    kv = await bus.kv(Buckets.SAGAS)
    ours = SagaStore(kv)
    watch = await following(ours)
    try:
        with caplog.at_level(logging.WARNING):
            await kv.put(subjects.encode_node("gpu-x"), b'{"not": "a saga"}')
            await SagaStore(kv).create(saga_for(SPEC, node="gpu-a"))
            await until(lambda: ours.cached("gpu-a") is not None)
        assert ours.cached("gpu-x") is None
        assert "does not decode" in caplog.text
    finally:
        await stopped(watch)


def test_an_older_change_never_replaces_a_newer_one() -> None:
    """The watch delivers the store's own writes after they returned, and may deliver a
    change the index has already overtaken."""
    index = SagaIndex()
    first = StoredSaga(saga_for(SPEC), 3)
    newer = StoredSaga(first.saga.model_copy(update={"state": S.CORDON_REQUIRED}), 7)
    assert index.record(newer)
    assert not index.record(first)
    assert not index.forget(NODE, 5)  # a delete older than the write known
    assert index.get(NODE) == newer
    assert index.forget(NODE, 9)
    assert not index.record(StoredSaga(first.saga, 8))  # older than the delete
    assert index.get(NODE) is None


def test_a_rebuild_keeps_a_write_made_after_everything_the_read_saw() -> None:
    index = SagaIndex()
    raced = StoredSaga(saga_for(SPEC, node="gpu-a"), 12)
    stale = StoredSaga(saga_for(SPEC, node="gpu-b"), 4)
    index.record(raced)
    index.record(stale)
    read = [StoredSaga(saga_for(SPEC, node="gpu-c"), 10)]
    index.reset(read, deleted=[("gpu-b", 6)])
    assert [s.saga.node for s in index.all()] == ["gpu-a", "gpu-c"]


async def test_a_stale_index_makes_the_write_conflict_and_the_retry_keeps_both_writes(
    bus: InMemoryBus,
) -> None:
    kv = await bus.kv(Buckets.SAGAS)
    ours, theirs = SagaStore(kv), SagaStore(kv)  # ours does not follow: it goes stale
    created = await ours.create(saga_for(SPEC))
    await theirs.get(NODE)
    theirs_write = await theirs.replace(
        created.saga.model_copy(update={"boot_id": BOOT_B}), created.revision
    )
    stale = ours.cached(NODE)
    assert stale == created
    with pytest.raises(RevisionConflict):
        await ours.replace(stale.saga.model_copy(update={"canary": True}), stale.revision)
    # the conflict taught the index the newer saga, so the retry builds on it
    fresh = ours.cached(NODE)
    assert fresh == theirs_write
    written = await ours.replace(fresh.saga.model_copy(update={"canary": True}), fresh.revision)
    in_kv = await SagaStore(kv).get(NODE)
    assert in_kv is not None and in_kv.revision == written.revision
    assert in_kv.saga.boot_id == BOOT_B and in_kv.saga.canary  # neither write lost


async def test_a_stale_index_missing_a_saga_makes_create_fail_and_learns_it(
    bus: InMemoryBus,
) -> None:
    kv = await bus.kv(Buckets.SAGAS)
    ours, theirs = SagaStore(kv), SagaStore(kv)
    theirs_saga = await theirs.create(saga_for(SPEC))
    assert ours.cached(NODE) is None
    with pytest.raises(KeyExists):
        await ours.create(saga_for(SPEC, boot_id=BOOT_B))
    assert ours.cached(NODE) == theirs_saga
    in_kv = await SagaStore(kv).get(NODE)
    assert in_kv == theirs_saga


async def test_an_admission_from_a_stale_index_is_decided_on_the_saga_in_kv(
    bus: InMemoryBus,
) -> None:
    """The index says upgrade-required, KV says another writer moved the saga on: the
    admission is published, and the decision, taken on the saga read from KV, ignores it."""
    stack = Stack(bus, SPEC)
    runner = await stack.start()
    assert stack.store is not None
    try:
        created = await stack.store.create(saga_for(SPEC))
        other = SagaStore(await bus.kv(Buckets.SAGAS))
        moved = created.saga.model_copy(update={"state": S.UPGRADE_DONE})
        in_kv = await other.replace(moved, created.revision)
        planned = await runner.admit({NODE: NodeStatus()}, T0)
        assert planned is not None and planned.nodes == (NODE,)  # from the stale index
        saga = created.saga
        admitted = NodeAdmitted(
            rollout_id=saga.rollout_id, saga_id=saga.saga_id, attempt=saga.attempt
        )
        assert await runner.apply(NODE, admitted, T0) is None
        assert await stack.store.get(NODE) == in_kv  # nothing written over the newer saga
        assert stack.store.cached(NODE) == in_kv  # and the read put it in the index
    finally:
        await stack.stop()


async def test_runner_admission_admits_what_the_full_read_admits(bus: InMemoryBus) -> None:
    spec = policy(max_parallel_upgrades=3, max_unavailable=4, canary={"nodes": 1})
    stack = Stack(bus, spec)
    runner = await stack.start()
    assert stack.store is not None
    layout = [S.UPGRADE_DONE] * 6 + [S.DRAIN_REQUIRED, S.UPGRADE_FAILED] + [S.UPGRADE_REQUIRED] * 4
    statuses = {}
    try:
        for n, state in enumerate(layout):
            node = f"gpu-{n:02d}"
            saga = saga_for(spec, node=node).model_copy(
                update={"state": state, "canary": n == 0, "cordoned": state is S.DRAIN_REQUIRED}
            )
            await stack.store.create(saga)
            statuses[node] = NodeStatus(unschedulable=n == 9)
        every = [entry.saga for entry in await stack.store.all()]
        expected = admission.plan(every, statuses, spec, T0)
        planned = await runner.admit(statuses, T0)
    finally:
        await stack.stop()
    assert planned == expected
    assert planned.nodes == ("gpu-09", "gpu-08")  # the cordoned one first
    assert len(stack.store.index.live()) == 6
