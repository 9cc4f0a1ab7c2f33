"""Every kind of id in `gpuop.events.ids` is stable, and no two kinds meet on one id, however
adversarial the parts (node names that spell another kind's token, owners and tokens that
differ only in where a `/` falls)."""

from __future__ import annotations

import re
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuop.events import ids
from gpuop.events.driver import Component
from gpuop.saga.upgrade.steps import Step, StepKind

WORDS = ["started", "admitted", "removed", "outcome", "result", "label", "event", "pods"]
"""Words the kinds' tokens are made of: a node, rollout or state named so is the hard case."""
name = st.one_of(
    st.sampled_from(WORDS), st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)
)
rollout = name.map(lambda n: f"rollout-{n}")
saga = st.builds(lambda r, n: f"{r}/{n}", rollout, name)
hexid = st.from_regex(r"[0-9a-f]{32}", fullmatch=True)
uid = st.one_of(st.uuids().map(str), name, rollout)  # a Node without a uid: its name
small = st.integers(min_value=1, max_value=3)
step_token = st.builds(
    lambda kind, component, round_: Step(kind=kind, component=component, round=round_).token,
    st.sampled_from(StepKind),
    st.none() | st.sampled_from(Component),
    small,
)
what = st.one_of(
    st.sampled_from(["started", "completed", "failed"]), rollout.map(lambda r: f"superseded-by-{r}")
)

KINDS: dict[str, st.SearchStrategy[str]] = {
    "step": st.builds(ids.step, saga, step_token, small),
    "label": st.builds(ids.label, saga, small, small),
    "kube_event": st.builds(ids.kube_event, saga, small, small),
    "transition": st.builds(ids.transition, saga, small),
    "started": st.builds(ids.started, saga),
    "admitted": st.builds(ids.admitted, saga, small),
    "deadline": st.builds(ids.deadline, saga, name, step_token, small),
    "pods_observed": st.builds(ids.pods_observed, saga, st.tuples(small, small, small), small),
    "node_observed": st.builds(ids.node_observed, uid, st.integers(1, 99).map(str)),
    "node_removed": st.builds(ids.node_removed, uid),
    "rollout_event": st.builds(ids.rollout_event, rollout, what),
    "outcome": st.builds(ids.outcome, hexid),
    "result": st.builds(ids.result, hexid),
}


def test_every_kind_has_a_function_and_a_row_in_the_table() -> None:
    documented = re.findall(r"^    [a-z ]+?  +(\w+)\(", ids.__doc__ or "", flags=re.M)
    functions: list[Callable[..., str]] = [getattr(ids, kind) for kind in KINDS]
    assert sorted(documented) == sorted(f.__name__ for f in functions)


def test_the_same_facts_give_the_same_id() -> None:
    assert ids.step("rollout-a/gpu-1", "cordon", 1) == ids.step("rollout-a/gpu-1", "cordon", 1)
    assert ids.step("rollout-a/gpu-1", "cordon", 1) != ids.step("rollout-a/gpu-1", "cordon", 2)
    assert re.fullmatch(r"[0-9a-f]{32}", ids.result(ids.step("rollout-a/gpu-1", "load-gpu", 1)))


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_two_kinds_never_meet_on_one_id(data: st.DataObject) -> None:
    first, second = data.draw(
        st.lists(st.sampled_from(sorted(KINDS)), min_size=2, max_size=2, unique=True)
    )
    assert data.draw(KINDS[first]) != data.draw(KINDS[second]), (first, second)
