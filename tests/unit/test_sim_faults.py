"""The simulated API server's fault plan on its own: rates, eligible requests, Retry-After,
validation, run-time changes and the timers that end watches."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from gpuop_sim.apiserver.faults import FaultPlan


def statuses(plan: FaultPlan, count: int) -> list[int]:
    """How `count` requests for nodes would be answered, in order: 0 for served."""
    faults = [plan.fault("GET", "/api/v1/nodes") for _ in range(count)]
    return [0 if fault is None else fault.status for fault in faults]


def answers(plan: FaultPlan, count: int) -> Counter[int]:
    return Counter(statuses(plan, count))


def test_rates_are_honoured_and_a_seed_repeats_the_same_faults() -> None:
    plan = FaultPlan(error_rate=0.1, throttle_rate=0.2, seed=7)

    found = answers(plan, 10_000)
    first, again = (FaultPlan(error_rate=0.1, throttle_rate=0.2, seed=7) for _ in range(2))

    assert 900 <= found[500] <= 1100
    assert 1800 <= found[429] <= 2200
    assert plan.injected == Counter({500: found[500], 429: found[429]})
    assert statuses(first, 200) == statuses(again, 200)
    assert statuses(FaultPlan(error_rate=0.5, seed=8), 200) != statuses(first, 200)


def test_a_500_is_an_internal_error_status() -> None:
    fault = FaultPlan(error_rate=1.0).fault("POST", "/api/v1/namespaces/default/pods")

    assert fault is not None
    assert fault.status == 500
    assert fault.content_type == "application/json"
    assert fault.body is not None
    status = json.loads(bytes(fault.body))  # type: ignore[arg-type]
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "InternalError", 500)
    assert status["message"].startswith("Internal error occurred: ")


@pytest.mark.parametrize(
    ("retry_after", "header", "seconds"), [(1.0, "1", 1), (0.2, "0.2", 1), (3, "3", 3)]
)
def test_a_429_asks_the_client_to_come_back_after_retry_after(
    retry_after: float, header: str, seconds: int
) -> None:
    fault = FaultPlan(throttle_rate=1.0, retry_after=retry_after).fault(
        "GET", "/apis/gpuop.io/v1alpha1/x"
    )

    assert fault is not None
    assert fault.status == 429
    assert fault.headers["Retry-After"] == header
    status = json.loads(bytes(fault.body))  # type: ignore[arg-type]
    assert status["reason"] == "TooManyRequests"
    assert status["details"] == {"retryAfterSeconds": seconds}


def test_only_api_paths_are_eligible_by_default() -> None:
    plan = FaultPlan(error_rate=1.0)

    assert plan.fault("GET", "/api") is not None
    assert plan.fault("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases") is not None
    for path in ("/healthz", "/livez", "/readyz", "/version", "/openapi/v2", "/apiary"):
        assert plan.fault("GET", path) is None, path


def test_paths_and_methods_restrict_the_faults() -> None:
    plan = FaultPlan(error_rate=1.0, paths=r"/api/v1/nodes(/.*)?", methods=["patch"])

    assert plan.fault("PATCH", "/api/v1/nodes/gpu-node-1") is not None
    assert plan.fault("GET", "/api/v1/nodes/gpu-node-1") is None
    assert plan.fault("PATCH", "/api/v1/namespaces/default/pods/p") is None
    assert plan.injected[500] == 1


def test_faults_change_at_run_time() -> None:
    plan = FaultPlan()
    assert not plan.active
    assert answers(plan, 100) == Counter({0: 100})

    plan.throttle_rate = 1.0
    assert plan.active
    assert answers(plan, 10) == Counter({429: 10})

    plan.off()
    assert not plan.active
    assert answers(plan, 10) == Counter({0: 10})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"error_rate": 1.5}, "error_rate must be between 0 and 1"),
        ({"throttle_rate": -0.1}, "throttle_rate must be between 0 and 1"),
        ({"error_rate": 0.6, "throttle_rate": 0.6}, "together exceed 1"),
        ({"retry_after": 0}, "retry_after must be a positive number"),
        ({"watch_drop_seconds": float("nan")}, "watch_drop_seconds must be a positive"),
        ({"watch_drop_seconds": float("inf")}, "watch_drop_seconds must be a positive"),
        ({"paths": "("}, "paths is not a regular expression"),
    ],
)
def test_bad_settings_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultPlan(**options)  # type: ignore[arg-type]


def test_a_change_that_would_exceed_one_is_refused_and_leaves_the_plan_as_it_was() -> None:
    plan = FaultPlan(error_rate=0.5)

    with pytest.raises(ValueError, match="together exceed 1"):
        plan.throttle_rate = 0.6

    assert (plan.error_rate, plan.throttle_rate) == (0.5, 0.0)


async def test_watches_end_after_a_random_time_of_the_mean_while_drops_are_on() -> None:
    plan = FaultPlan(watch_drop_seconds=0.02, seed=3)
    ended = [asyncio.Event() for _ in range(20)]
    releases = [plan.watch_opened(event.set) for event in ended]

    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in ended)), 5)
    for release in releases:
        release()

    assert plan.watches_dropped == 20


async def test_watches_opened_before_drops_are_turned_on_are_dropped_too() -> None:
    plan = FaultPlan()
    ended = asyncio.Event()
    release = plan.watch_opened(ended.set)
    await asyncio.sleep(0.05)
    assert not ended.is_set()

    plan.watch_drop_seconds = 0.01
    await asyncio.wait_for(ended.wait(), 5)
    release()

    assert plan.watches_dropped == 1


async def test_turning_drops_off_spares_the_open_watches_and_a_closed_watch_is_forgotten() -> None:
    plan = FaultPlan(watch_drop_seconds=0.05)
    kept, closed = asyncio.Event(), asyncio.Event()
    release_kept = plan.watch_opened(kept.set)
    release_closed = plan.watch_opened(closed.set)
    release_closed()  # the client went away first

    plan.off()
    await asyncio.sleep(0.2)
    release_kept()

    assert not kept.is_set() and not closed.is_set()
    assert plan.watches_dropped == 0
