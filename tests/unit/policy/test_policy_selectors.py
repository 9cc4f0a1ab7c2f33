"""Pod selectors in the policy are checked for label selector syntax."""

from __future__ import annotations

import pytest

from gpuop.policy import selectors


@pytest.mark.parametrize(
    "selector",
    [
        "",
        "app=training",
        "app==training",
        "tier!=batch",
        "app=training,tier!=batch",
        "app = training , tier != batch",
        "gpuop.io/role",
        "!preemptible",
        "! preemptible",
        "queue in (a, b,c)",
        "queue notin (a)",
        "queue in (a,b),app=x",
        "empty=",
        "priority>5",
        "priority < -1",
        "example.com/team=ml-infra",
    ],
)
def test_well_formed_selectors_are_accepted(selector: str) -> None:
    assert selectors.is_valid(selector)


@pytest.mark.parametrize(
    "selector",
    [
        "app in training",
        "app=training,",
        ",app",
        "app=a b",
        "app in (a,b",
        "-app=x",
        "app=x=y",
        "Example.com/team=x",
        f"{'a' * 254}/team=x",
        f"{'k' * 64}=v",
        f"k={'v' * 64}",
        "priority>five",
    ],
)
def test_malformed_selectors_are_refused(selector: str) -> None:
    assert not selectors.is_valid(selector)


def test_commas_inside_parentheses_do_not_split_terms() -> None:
    assert selectors.terms("a in (x,y), b") == ["a in (x,y)", "b"]


LABELS = {"pool": "training", "zone": "b", "gpuop.io/canary": "", "priority": "7"}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ("", True),
        ("pool=training", True),
        ("pool==training,zone=b", True),
        ("pool=inference", False),
        ("pool!=inference", True),
        ("team!=ml", True),  # an absent key is not equal to anything
        ("zone in (a, b)", True),
        ("zone in (a,c)", False),
        ("zone notin (a,c)", True),
        ("team notin (ml)", True),
        ("gpuop.io/canary", True),
        ("gpuop.io/canary=", True),
        ("!gpuop.io/canary", False),
        ("! spot", True),
        ("priority>5", True),
        ("priority < 5", False),
        ("pool>5", False),  # not a number
        ("missing>1", False),
        ("pool=training,zone in (a)", False),
    ],
)
def test_node_selectors_match_as_the_api_server_matches(selector: str, selected: bool) -> None:
    assert selectors.is_valid(selector)
    assert selectors.matches(selector, LABELS) is selected
