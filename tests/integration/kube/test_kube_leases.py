"""Lease leader election: acquire, renew, lose, release, and hand over when the holder
stops renewing; two candidates never both lead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from gpuop.clocks import VirtualClock
from gpuop.kube import client, errors, leases
from gpuop.kube.leases import Attempt, LeaderElection
from gpuop_sim import ApiServer

LEASE = "gpuop-upgrade-orchestrator"
Candidate = Callable[..., LeaderElection]


@pytest.fixture
def candidate(kube: client.Kube) -> Candidate:
    """Short durations so a handover takes about a second."""

    def make(identity: str, **overrides: object) -> LeaderElection:
        settings: dict[str, object] = {
            "lease_duration": 1,
            "renew_deadline": 0.6,
            "retry_period": 0.1,
            **overrides,
        }
        return LeaderElection(kube, LEASE, identity=identity, **settings)  # type: ignore[arg-type]

    return make


@pytest.fixture
async def running() -> AsyncIterator[Callable[[LeaderElection], asyncio.Task[None]]]:
    """Starts candidates' `run()` and cancels whatever is still running at the end."""
    tasks: list[asyncio.Task[None]] = []

    def start(election: LeaderElection) -> asyncio.Task[None]:
        task = asyncio.create_task(election.run(), name=f"election-{election.identity}")
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def read_lease(kube: client.Kube) -> dict[str, object]:
    lease = await kube.call(kube.coordination.read_namespaced_lease, LEASE, "default")
    spec: dict[str, object] = lease["spec"]
    return spec


async def test_the_first_candidate_creates_the_lease_and_leads(
    kube: client.Kube, candidate: Candidate, running: Callable[..., asyncio.Task[None]]
) -> None:
    started: list[str] = []
    a = candidate("a", on_started_leading=lambda: started.append("a"))

    running(a)
    await asyncio.wait_for(a.leading_event.wait(), 2)

    spec = await read_lease(kube)
    assert a.is_leader
    assert started == ["a"]
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0
    assert str(spec["renewTime"]).endswith("Z")


async def test_leadership_passes_when_the_holder_stops_renewing(
    kube: client.Kube, candidate: Candidate, running: Callable[..., asyncio.Task[None]]
) -> None:
    loop = asyncio.get_running_loop()
    a = candidate("a", release_on_stop=False)  # a crash: nobody releases the lease
    b = candidate("b")
    a_task = running(a)
    await asyncio.wait_for(a.leading_event.wait(), 2)
    running(b)

    await asyncio.sleep(1.3)  # longer than the lease: a keeps renewing, b keeps waiting
    assert a.is_leader
    assert not b.is_leader

    await stop(a_task)
    stopped = loop.time()
    await asyncio.wait_for(b.leading_event.wait(), 3)

    assert loop.time() - stopped >= 0.8  # b waited out the lease it last saw renewed
    spec = await read_lease(kube)
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1


async def test_a_released_lease_is_taken_without_waiting(
    kube: client.Kube, candidate: Candidate, running: Callable[..., asyncio.Task[None]]
) -> None:
    a = candidate("a", lease_duration=30, renew_deadline=20, retry_period=0.1)
    a_task = running(a)
    await asyncio.wait_for(a.leading_event.wait(), 2)

    await stop(a_task)
    released = await read_lease(kube)
    b = candidate("b", lease_duration=30, renew_deadline=20, retry_period=0.1)

    assert not a.is_leader
    assert released["holderIdentity"] == ""
    assert await b.try_acquire_or_renew() is Attempt.LEADING


async def test_an_unexpired_lease_is_taken_early_only_from_a_holder_vouched_stopped(
    kube: client.Kube, candidate: Candidate, running: Callable[..., asyncio.Task[None]]
) -> None:
    """`takes_over` (the orchestrator's presence) lets a candidate take a lease that has
    not expired, with the same conditional write, only from the holder it names; `wake`
    makes it try at once rather than after its retry period."""
    fenced: set[str] = set()
    slow = {"lease_duration": 30, "renew_deadline": 20, "retry_period": 10}
    a = candidate("a", release_on_stop=False, **slow)
    a_task = running(a)
    await asyncio.wait_for(a.leading_event.wait(), 2)
    b = candidate("b", takes_over=fenced.__contains__, **slow)
    running(b)
    await asyncio.sleep(0.2)
    assert await b.try_acquire_or_renew() is Attempt.HELD
    assert b.holder == "a"

    await stop(a_task)  # a crash: the lease stays a's for 30 s
    fenced.add("someone-else")
    b.wake()
    await asyncio.sleep(0.2)
    assert not b.is_leader

    fenced.add("a")
    b.wake()
    await asyncio.wait_for(b.leading_event.wait(), 2)  # well before the 10 s retry period

    spec = await read_lease(kube)
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1
    assert b.holder == "b"


async def test_a_leader_steps_down_at_once_when_another_holder_took_the_lease(
    kube: client.Kube, candidate: Candidate, running: Callable[..., asyncio.Task[None]]
) -> None:
    stopped: list[str] = []
    a = candidate("a", on_stopped_leading=lambda: stopped.append("a"))
    running(a)
    await asyncio.wait_for(a.leading_event.wait(), 2)

    await kube.call(
        kube.coordination.patch_namespaced_lease,
        LEASE,
        "default",
        {"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 30}},
        _content_type="application/merge-patch+json",
    )
    await asyncio.wait_for(a.following_event.wait(), 1)

    assert stopped == ["a"]
    assert (await read_lease(kube))["holderIdentity"] == "intruder"


async def test_of_two_candidates_racing_for_an_expired_lease_exactly_one_wins(
    kube: client.Kube,
) -> None:
    clock = VirtualClock()
    old = LeaderElection(kube, LEASE, identity="old", clock=clock)
    a = LeaderElection(kube, LEASE, identity="a", clock=clock)
    b = LeaderElection(kube, LEASE, identity="b", clock=clock)
    assert await old.try_acquire_or_renew() is Attempt.LEADING
    assert await a.try_acquire_or_renew() is Attempt.HELD
    assert await b.try_acquire_or_renew() is Attempt.HELD

    clock.advance(15)  # "old" has not renewed for its whole lease duration
    outcomes = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())

    # the loser either lost the compare-and-set (both read the expired lease) or, on a busy
    # machine, read the lease only after the winner's write and found it held
    assert outcomes.count(Attempt.LEADING) == 1
    assert set(outcomes) - {Attempt.LEADING} <= {Attempt.CONFLICT, Attempt.HELD}
    winner = "a" if outcomes[0] is Attempt.LEADING else "b"
    assert (await read_lease(kube))["holderIdentity"] == winner


async def test_of_two_candidates_racing_to_create_the_lease_exactly_one_wins(
    kube: client.Kube,
) -> None:
    a = LeaderElection(kube, LEASE, identity="a")
    b = LeaderElection(kube, LEASE, identity="b")

    outcomes = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())

    assert outcomes.count(Attempt.LEADING) == 1  # the other lost the create, or found it made
    assert set(outcomes) - {Attempt.LEADING} <= {Attempt.CONFLICT, Attempt.HELD}


async def test_a_leader_that_cannot_renew_steps_down_by_its_renew_deadline(
    server: ApiServer, candidate: Candidate, running: Callable[..., asyncio.Task[None]]
) -> None:
    loop = asyncio.get_running_loop()
    a = candidate("a")
    running(a)
    await asyncio.wait_for(a.leading_event.wait(), 2)

    await server.stop()  # the API server goes away: every renewal fails
    lost_at = loop.time()
    await asyncio.wait_for(a.following_event.wait(), 2)

    # not at the first failed renewal, but once renew_deadline (0.6 s) has passed without one
    assert loop.time() - lost_at >= 0.4


def test_timings_must_leave_the_leader_time_to_step_down(kube: client.Kube) -> None:
    with pytest.raises(ValueError, match="renew_deadline < lease_duration"):
        LeaderElection(kube, LEASE, lease_duration=10, renew_deadline=10)


def test_lease_times_always_carry_microseconds() -> None:
    moment = VirtualClock().now()

    assert leases.micro_time(moment) == "2026-01-01T00:00:00.000001Z"


async def test_one_try_reads_and_writes_within_the_renew_deadline_retries_included(
    server: ApiServer, kube: client.Kube, candidate: Candidate
) -> None:
    """A leader must learn that a renewal failed before the lease can pass to another
    candidate: the write gets what the read left of `renew_deadline`, not a deadline of its
    own, and a retry that would end past it is not made."""
    waits: list[float] = []

    class ThrottledClock(VirtualClock):
        """Only the first read is throttled; then every write."""

        async def sleep(self, seconds: float) -> None:
            waits.append(seconds)
            server.faults.methods = ["PATCH"]
            await super().sleep(seconds)

    a = candidate("a", renew_deadline=0.6, clock=(clock := ThrottledClock()))
    kube.clock = clock
    assert await a.try_acquire_or_renew() is Attempt.LEADING  # creates the lease
    server.faults.throttle_rate, server.faults.retry_after = 1.0, 0.4
    server.faults.methods = ["GET"]

    with pytest.raises(errors.TooManyRequests):
        await a.try_acquire_or_renew()

    assert waits == [0.4]  # the read's retry; 0.2 s were left for the write, too few to retry
    assert clock.monotonic() <= 0.6
    patches = [r.status for r in server.request_log if r.method == "PATCH"]
    assert patches == [429]
