"""What the decision core computes from the policy: unavailability budget, backoff, waits."""

from __future__ import annotations

import pytest

from gpuop.policy import Deadlines, Drain, PodDeletion, Retry, UpgradePolicy, WaitForCompletion


@pytest.mark.parametrize(
    ("max_unavailable", "total", "expected"),
    [
        ("25%", 10, 3),  # ceil(2.5), upstream's own example
        ("25%", 16, 4),
        ("25%", 1, 1),
        ("25%", 3, 1),
        ("25%", 5, 2),
        ("1%", 1000, 10),
        ("1%", 3, 1),
        ("33%", 100, 33),
        ("50%", 7, 4),
        ("100%", 9, 9),
        (3, 10, 3),
        (5, 3, 3),  # a count is capped at the nodes there are
        (1, 1000, 1),
        ("25%", 0, 0),
        (2, 0, 0),
    ],
)
def test_max_unavailable_of_scales_percentages_up_and_caps_counts(
    max_unavailable: int | str, total: int, expected: int
) -> None:
    policy = UpgradePolicy(max_unavailable=max_unavailable)

    assert policy.max_unavailable_of(total) == expected


def test_the_default_allows_a_quarter_of_the_nodes_rounded_up() -> None:
    assert [UpgradePolicy().max_unavailable_of(n) for n in (1, 4, 8, 10, 16)] == [1, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 60.0), (2, 120.0), (3, 240.0), (4, 480.0), (5, 900.0), (6, 900.0), (10_000, 900.0)],
)
def test_backoff_doubles_per_failed_attempt_up_to_the_cap(attempt: int, expected: float) -> None:
    assert UpgradePolicy().backoff(attempt) == expected


def test_backoff_follows_the_retry_settings() -> None:
    policy = UpgradePolicy(
        retry=Retry(max_attempts=5, backoff_seconds=5, max_backoff_seconds=5 * 86400)
    )

    assert [policy.backoff(n) for n in range(1, 5)] == [5.0, 10.0, 20.0, 40.0]
    assert policy.backoff(1000) == 5 * 86400


def test_a_zero_backoff_retries_at_once() -> None:
    policy = UpgradePolicy(retry=Retry(backoff_seconds=0, max_backoff_seconds=0))

    assert policy.backoff(1) == policy.backoff(50) == 0.0


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        UpgradePolicy().backoff(0)


def test_an_upstream_timeout_shorter_than_the_deadline_limits_the_wait() -> None:
    policy = UpgradePolicy(
        wait_for_completion=WaitForCompletion(pod_selector="app=job", timeout_seconds=60),
        pod_deletion=PodDeletion(timeout_seconds=300),
        drain=Drain(enable=True, timeout_seconds=120),
    )

    assert policy.wait_for_jobs_limit == 60
    assert policy.pod_deletion_limit == 300
    assert policy.drain_limit == 120


def test_a_zero_or_longer_upstream_timeout_leaves_the_deadline_in_charge() -> None:
    policy = UpgradePolicy(
        wait_for_completion=WaitForCompletion(timeout_seconds=0),
        pod_deletion=PodDeletion(timeout_seconds=0),
        drain=Drain(timeout_seconds=10_000),
        deadlines=Deadlines(wait_for_jobs=1800, pod_deletion=400, drain=900),
    )

    assert policy.wait_for_jobs_limit == 1800
    assert policy.pod_deletion_limit == 400
    assert policy.drain_limit == 900
