"""Leadership of the upgrade orchestrator: the Lease and the leader's NATS presence.

Two or three replicas run `leading.lead` against the simulated API server and one in-memory
bus, each through a bus of its own that a test can cut off from NATS. The controller is
replaced by one that only records when it runs, so the tests see every moment at which a
replica acted: never two at once, whatever fails. A SIGKILL is a replica cancelled without
releasing anything (no Lease release, the presence left as it was). The Lease lasts 15 s
in these tests and the presence 1 s, so a takeover before the Lease could expire can only
have come from the presence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpuop.bus import Buckets, InMemoryBus, KvEntry, NatsBus, NatsServer
from gpuop.bus.errors import BusUnavailable
from gpuop.bus.memory import MemoryKeyValue
from gpuop.kube import client
from gpuop.kube import errors as kubeerrors
from gpuop.kube.leases import LeaderElection
from gpuop.services.upgrade_orchestrator import leading
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.presence import PRESENCE_KEY, Presence, decode, encode
from gpuop.services.upgrade_orchestrator.store import SagaStore
from gpuop_sim import ApiServer
from tests.support.waiting import eventually

LEASE_SECONDS = 15
PRESENCE_SECONDS = 1.0
CONFIG = OrchestratorConfig(
    lease_duration_seconds=LEASE_SECONDS, presence_seconds=PRESENCE_SECONDS, resync_seconds=1
)


class CutKeyValue:
    """A replica's view of the shared bucket that a test can cut off: while cut, every call
    hangs (`hang`) or fails as an unreachable server would."""

    def __init__(self, shared: MemoryKeyValue) -> None:
        self.shared = shared
        self.cut = False
        self.hang = False
        self.delay = 0.0

    @property
    def bucket(self) -> str:
        return self.shared.bucket

    async def _through(self, call: Callable[[], Awaitable[Any]]) -> Any:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.cut:
            if self.hang:
                await asyncio.Event().wait()
            raise BusUnavailable("cut off from NATS by the test")
        return await call()

    async def get(self, key: str) -> KvEntry | None:
        found: KvEntry | None = await self._through(lambda: self.shared.get(key))
        return found

    async def put(self, key: str, value: bytes) -> int:
        written: int = await self._through(lambda: self.shared.put(key, value))
        return written

    async def create(self, key: str, value: bytes) -> int:
        written: int = await self._through(lambda: self.shared.create(key, value))
        return written

    async def update(self, key: str, value: bytes, revision: int) -> int:
        written: int = await self._through(lambda: self.shared.update(key, value, revision))
        return written

    async def delete(self, key: str, revision: int | None = None) -> None:
        await self._through(lambda: self.shared.delete(key, revision))

    async def keys(self) -> list[str]:
        found: list[str] = await self._through(self.shared.keys)
        return found

    def watch(self, pattern: str = ">") -> AsyncIterator[KvEntry | None]:
        return self.shared.watch(pattern)


class ReplicaBus(InMemoryBus):
    """One replica's connection to the shared in-memory bus."""

    def __init__(self, shared: InMemoryBus) -> None:
        super().__init__()
        self.shared = shared
        self.views: dict[str, CutKeyValue] = {}
        self.refusals = 0
        """How many of the next bucket opens fail, as on a server that is not there yet."""

    async def kv(self, bucket: Buckets | str) -> Any:
        if self.refusals:
            self.refusals -= 1
            raise BusUnavailable("no NATS yet")
        real = await self.shared.kv(bucket)
        return self.views.setdefault(real.bucket, CutKeyValue(real))

    def cut(self, *, hang: bool = False) -> None:
        for view in self.views.values():
            view.cut, view.hang = True, hang

    def mend(self) -> None:
        for view in self.views.values():
            view.cut = False

    def slow(self, delay: float) -> None:
        for view in self.views.values():
            view.delay = delay


@dataclass
class Acting:
    """When each replica's controller ran: the test's view of who acted."""

    running: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    most_at_once: int = 0

    def started(self, name: str) -> None:
        self.running[name] = time.monotonic()
        self.most_at_once = max(self.most_at_once, len(self.running))

    def stopped(self, name: str) -> None:
        self.spans.append((name, self.running.pop(name), time.monotonic()))

    def leader(self) -> str | None:
        return next(iter(self.running), None)


@pytest.fixture
def acting(monkeypatch: pytest.MonkeyPatch) -> Acting:
    """Replaces the controller by one that records when it runs, under its replica's name."""
    record = Acting()

    class RecordingController:
        def __init__(self, *args: object, **kwargs: object) -> None:
            made_by = asyncio.current_task()  # `leading.lead`'s, named after its replica
            assert made_by is not None
            self.replica = made_by.get_name()

        async def run(self) -> None:
            name = self.replica
            record.started(name)
            try:
                await asyncio.Event().wait()
            finally:
                record.stopped(name)

    monkeypatch.setattr(leading, "Controller", RecordingController)
    return record


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer() as running:
        yield running


@dataclass
class Replica:
    name: str
    bus: ReplicaBus
    kube: client.Kube
    task: asyncio.Task[None]
    stopping: asyncio.Event


@pytest.fixture
async def replicas(
    server: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Awaitable[Replica]]]:
    """Starts replicas of `leading.lead` (one Kubernetes client each); at the end stops those
    still running. `crashable` replicas never release the Lease (a SIGKILL releases nothing)."""
    shared = InMemoryBus()
    await shared.start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    started: list[Replica] = []
    crashable: set[str] = set()
    make_election = leading.election

    def election(*args: Any, **kwargs: Any) -> LeaderElection:
        candidate = make_election(*args, **kwargs)
        if candidate.identity.split("~")[0] in crashable:
            candidate.release_on_stop = False
        return candidate

    monkeypatch.setattr(leading, "election", election)

    async def start(
        name: str, config: OrchestratorConfig = CONFIG, *, crash: bool = False
    ) -> Replica:
        if crash:
            crashable.add(name)
        bus = ReplicaBus(shared)
        kube = await client.connect(kubeconfig)
        stopping = asyncio.Event()

        task = asyncio.create_task(
            leading.lead(bus, kube, config, stopping, identity=name), name=name
        )
        replica = Replica(name, bus, kube, task, stopping)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stopping.set()
    for replica in started:
        if not replica.task.done():
            await asyncio.wait_for(replica.task, 10)
        await replica.kube.close()


async def crash(replica: Replica) -> float:
    """SIGKILL: the replica stops at once and releases nothing; returns when."""
    replica.task.cancel()
    await asyncio.gather(replica.task, return_exceptions=True)
    return time.monotonic()


async def lease_spec(kube: client.Kube) -> dict[str, Any]:
    lease = await kube.call(
        kube.coordination.read_namespaced_lease, CONFIG.lease_name, CONFIG.lease_namespace
    )
    spec: dict[str, Any] = lease["spec"]
    return spec


def controller_named(acting: Acting, prefix: str) -> Callable[[], str | None]:
    def leads() -> str | None:
        found = acting.leader()
        return found if found is not None and found.startswith(prefix) else None

    return leads


async def test_a_standby_takes_over_a_killed_leader_before_its_lease_expires(
    replicas: Callable[..., Awaitable[Replica]], acting: Acting
) -> None:
    a = await replicas("a", crash=True)
    await eventually(controller_named(acting, "a"), 5)
    b = await replicas("b")
    await asyncio.sleep(PRESENCE_SECONDS * 2)  # b has watched a's presence renewed
    assert acting.leader() == "a"

    killed = await crash(a)
    await eventually(controller_named(acting, "b"), LEASE_SECONDS - 5)
    took = time.monotonic() - killed

    spec = await lease_spec(b.kube)
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1
    assert took < LEASE_SECONDS - 5, "the takeover waited for the Lease"
    assert acting.most_at_once == 1


async def test_a_leader_cut_off_from_nats_stops_acting_before_the_standby_starts(
    replicas: Callable[..., Awaitable[Replica]], acting: Acting
) -> None:
    """The presence stops while the leader still holds a valid Lease (it still reaches the
    API server and renews it): the leader stops acting by its own deadline, the standby
    fences it off and takes the Lease, and the old leader gives it up and stands by."""
    a = await replicas("a")
    await eventually(controller_named(acting, "a"), 5)
    await replicas("b")
    await asyncio.sleep(PRESENCE_SECONDS * 2)

    a.bus.cut(hang=True)
    cut_at = time.monotonic()
    await eventually(controller_named(acting, "b"), LEASE_SECONDS - 5)

    (a_span,) = [span for span in acting.spans if span[0] == "a"]
    b_started = acting.running["b"]
    assert a_span[2] < b_started, "the old leader still acted when the new one started"
    assert a_span[2] - cut_at < PRESENCE_SECONDS, "the leader acted past its deadline"
    assert acting.most_at_once == 1
    assert (await lease_spec(a.kube))["holderIdentity"] == "b"

    # back on NATS, the fenced replica campaigns under a new identity and never leads
    a.bus.mend()
    await asyncio.sleep(PRESENCE_SECONDS * 4)
    assert acting.leader() == "b"
    assert acting.most_at_once == 1


async def test_a_replica_that_cannot_open_the_presence_bucket_tries_again_and_leads(
    replicas: Callable[..., Awaitable[Replica]],
    acting: Acting,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    opened = ReplicaBus.__init__

    def refusing(self: ReplicaBus, shared: InMemoryBus) -> None:
        opened(self, shared)
        self.refusals = 2

    monkeypatch.setattr(ReplicaBus, "__init__", refusing)
    a = await replicas("a")

    await eventually(controller_named(acting, "a"), 15)
    assert a.bus.refusals == 0
    assert caplog.text.count("cannot open the presence's bucket") == 2


async def test_a_leader_whose_renewals_only_run_late_keeps_leading(
    replicas: Callable[..., Awaitable[Replica]], acting: Acting
) -> None:
    """Renewals that take a while but land within the deadline give no one a reason to
    fence the leader: the standby sees the presence change and never claims it."""
    patient = OrchestratorConfig(lease_duration_seconds=LEASE_SECONDS, presence_seconds=2)
    a = await replicas("a", patient)
    await eventually(controller_named(acting, "a"), 5)
    await replicas("b", patient)
    a.bus.slow(0.3)  # a renewal every 0.7 s, sent within the 1.33 s deadline of the last

    await asyncio.sleep(8)

    assert acting.leader() == "a"
    assert [span[0] for span in acting.spans] == []
    assert (await lease_spec(a.kube))["holderIdentity"] == "a"


async def test_a_leader_without_a_presence_is_taken_over_only_when_its_lease_expires(
    replicas: Callable[..., Awaitable[Replica]], acting: Acting
) -> None:
    """A holder that never wrote a presence (presence off, or an older version) is taken
    over by the Lease's rules alone, even when a stale presence of another replica is
    there to be claimed: a presence fences only the replica that holds the Lease."""
    lease_seconds = 3
    without = OrchestratorConfig(lease_duration_seconds=lease_seconds, presence_seconds=0)
    with_presence = OrchestratorConfig(lease_duration_seconds=lease_seconds, presence_seconds=0.5)
    a = await replicas("a", without, crash=True)
    await eventually(controller_named(acting, "a"), 5)
    kv = await a.bus.shared.kv(Buckets.SAGAS)
    await kv.put(PRESENCE_KEY, encode("someone-gone"))
    await replicas("b", with_presence)
    await asyncio.sleep(1.5)
    assert acting.leader() == "a", "b took the Lease of a holder without a presence"

    killed = await crash(a)
    await eventually(controller_named(acting, "b"), lease_seconds * 3)

    assert acting.running["b"] - killed > lease_seconds * 2 / 3
    assert decode((await kv.get(PRESENCE_KEY) or KvEntry("", b"", 0)).value) == "b"
    assert acting.most_at_once == 1


async def test_a_malformed_presence_fences_nobody_and_the_leader_overwrites_it(
    replicas: Callable[..., Awaitable[Replica]], acting: Acting
) -> None:
    assert decode(b"{not json") == ""
    assert decode(json.dumps({"holder": 7}).encode()) == ""
    assert decode(b"[]") == ""

    a = await replicas("a")
    real = await a.bus.shared.kv(Buckets.SAGAS)
    await real.put(PRESENCE_KEY, b"{not json")
    await eventually(controller_named(acting, "a"), 5)
    entry = await real.get(PRESENCE_KEY)
    assert entry is not None and decode(entry.value) == "a"


async def test_a_leader_cut_off_from_the_api_server_is_taken_over_once_it_stopped(
    replicas: Callable[..., Awaitable[Replica]], acting: Acting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other partition: the leader still reaches NATS but no longer the API server. It
    keeps its presence only while it holds the Lease by its own renew deadline (10 s of the
    15 s); then it stops acting and renewing, and the standby takes over one presence later,
    before the Lease expires, never while the old leader acts."""
    a = await replicas("a")
    await eventually(controller_named(acting, "a"), 5)
    b = await replicas("b")
    await asyncio.sleep(PRESENCE_SECONDS * 2)

    async def unreachable(*args: object, **kwargs: object) -> Any:
        raise kubeerrors.Unreachable("cut off from the API server by the test")

    monkeypatch.setattr(a.kube, "call", unreachable)
    cut_at = time.monotonic()
    await eventually(controller_named(acting, "b"), LEASE_SECONDS + 5)

    (a_span,) = [span for span in acting.spans if span[0] == "a"]
    assert a_span[2] < acting.running["b"]
    assert a_span[2] - cut_at < CONFIG.lease_duration_seconds * 2 / 3 + 1
    assert acting.most_at_once == 1
    assert (await lease_spec(b.kube))["holderIdentity"] == "b"


async def test_a_standby_does_not_claim_a_presence_it_cannot_read(
    replicas: Callable[..., Awaitable[Replica]], acting: Acting
) -> None:
    """A standby cut off from NATS sees no renewal; it must not read that as the leader's
    death: it claims nothing and the leader keeps leading."""
    a = await replicas("a")
    await eventually(controller_named(acting, "a"), 5)
    b = await replicas("b")
    await asyncio.sleep(PRESENCE_SECONDS)
    b.bus.cut()

    await asyncio.sleep(PRESENCE_SECONDS * 6)

    assert acting.leader() == "a"
    assert (await lease_spec(a.kube))["holderIdentity"] == "a"
    b.bus.mend()
    await asyncio.sleep(PRESENCE_SECONDS * 2)
    assert acting.leader() == "a"
    assert acting.most_at_once == 1


@pytest.mark.nats
async def test_through_a_real_nats_server_a_killed_leader_is_taken_over_by_its_presence(
    nats_server: NatsServer,
    server: ApiServer,
    tmp_path: Path,
    acting: Acting,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The presence in the real `gpuop_sagas` bucket (compare-and-set on the stream's
    revisions, reads from the stream leader), each replica on its own connection."""
    make_election = leading.election

    def crashing(*args: Any, **kwargs: Any) -> LeaderElection:
        candidate = make_election(*args, **kwargs)
        candidate.release_on_stop = False
        return candidate

    monkeypatch.setattr(leading, "election", crashing)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    async with contextlib.AsyncExitStack() as exits:
        tasks: dict[str, asyncio.Task[None]] = {}
        stopping = asyncio.Event()
        for name in ("a", "b"):
            bus = NatsBus(nats_server.url, name=f"replica-{name}")
            await bus.start()
            exits.push_async_callback(bus.close)
            kube = await exits.enter_async_context(await client.connect(kubeconfig))
            tasks[name] = asyncio.create_task(
                leading.lead(bus, kube, CONFIG, stopping, identity=name), name=name
            )
            if name == "a":
                await eventually(controller_named(acting, "a"), 10)
        try:
            await asyncio.sleep(PRESENCE_SECONDS * 2)
            assert acting.leader() == "a"
            tasks["a"].cancel()
            await asyncio.gather(tasks["a"], return_exceptions=True)

            await eventually(controller_named(acting, "b"), LEASE_SECONDS - 5)

            assert (await lease_spec(kube))["holderIdentity"] == "b"
            assert acting.most_at_once == 1
            sagas = await bus.kv(Buckets.SAGAS)
            entry = await sagas.get(PRESENCE_KEY)
            assert entry is not None and decode(entry.value) == "b"
            assert await SagaStore(sagas).all() == []
        finally:
            stopping.set()
            await asyncio.wait_for(tasks["b"], 10)


async def test_the_saga_store_skips_the_presence() -> None:
    bus = InMemoryBus()
    kv = await bus.kv(Buckets.SAGAS)
    await kv.put(PRESENCE_KEY, encode("a"))
    store = SagaStore(kv)

    assert await store.all() == []
    assert await store.load() == 0
    following = asyncio.create_task(store.follow())
    await asyncio.sleep(0.05)
    await kv.put(PRESENCE_KEY, encode("b"))
    await asyncio.sleep(0.05)
    following.cancel()
    await asyncio.gather(following, return_exceptions=True)
    assert store.sagas() == []


def test_the_presence_is_3_s_by_default_and_must_be_shorter_than_the_lease() -> None:
    assert OrchestratorConfig().presence_duration == 3.0
    assert OrchestratorConfig(presence_seconds=0).presence_duration == 0
    assert OrchestratorConfig(lease_duration_seconds=5).presence_duration == 0
    assert OrchestratorConfig(lease_duration_seconds=5, presence_seconds=2).presence_duration == 2
    with pytest.raises(ValidationError, match="presence_seconds"):
        OrchestratorConfig(lease_duration_seconds=3, presence_seconds=3)
    with pytest.raises(ValidationError, match="presence_seconds"):
        OrchestratorConfig(presence_seconds=0.1)
    with pytest.raises(ValueError, match="above 0"):
        Presence(MemoryKeyValue("b"), "a", duration=0)
