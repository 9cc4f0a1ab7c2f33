"""The one `maxUnavailable` arithmetic (`unavailable_budget`): a count or a percentage of the
nodes, and how many more may go down while some are down already."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuop.policy import Budget, UpgradePolicy, unavailable_budget


@pytest.mark.parametrize(
    ("max_unavailable", "total", "unavailable", "count", "free"),
    [
        ("25%", 0, 0, 0, 0),  # no node, no budget
        (3, 0, 0, 0, 0),
        ("25%", 10, 0, 3, 3),  # ceil(2.5): a percentage rounds up
        ("25%", 10, 2, 3, 1),
        ("33%", 10, 0, 4, 4),  # ceil(3.3)
        ("1%", 3, 0, 1, 1),  # at least one node whenever there is one
        ("50%", 7, 1, 4, 3),
        ("100%", 4, 2, 4, 4),  # a budget of every node is not cut by those down
        ("150%", 4, 1, 4, 4),  # over 100%: every node, no more
        (9, 4, 1, 4, 4),  # a count over the nodes there are: every node
        (3, 10, 2, 3, 1),
        (3, 10, 3, 3, 0),  # down as many as allowed: nothing free
        (3, 10, 5, 3, 0),  # more down than the budget: nothing free, never negative
        ("25%", 10, 7, 3, 0),
        ("100%", 4, 4, 4, 0),
        (0, 5, 0, 0, 0),  # a zero count (the policy refuses it) frees nothing
    ],
)
def test_unavailable_budget_scales_the_policy_and_subtracts_what_is_down(
    max_unavailable: int | str, total: int, unavailable: int, count: int, free: int
) -> None:
    assert unavailable_budget(max_unavailable, total, unavailable) == Budget(
        total=total, max_unavailable=count, unavailable=unavailable, free=free
    )


@pytest.mark.parametrize("max_unavailable", ["25%", "100%", 1, 3])
def test_the_policy_scales_its_field_with_the_same_arithmetic(max_unavailable: int | str) -> None:
    policy = UpgradePolicy(max_unavailable=max_unavailable)

    for total in range(12):
        expected = unavailable_budget(max_unavailable, total, 0).max_unavailable
        assert policy.max_unavailable_of(total) == expected


@pytest.mark.parametrize("refused", ["0%", "150%", "25", 0, -1, True])
def test_the_policy_refuses_a_budget_outside_one_node_to_every_node(refused: object) -> None:
    with pytest.raises(ValidationError, match="must be an integer >= 1 or a percentage"):
        UpgradePolicy.model_validate({"maxUnavailable": refused})
