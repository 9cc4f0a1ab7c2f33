"""One label-selector matcher for both spellings: a Kubernetes LabelSelector object and the
string form select the same labels; an unknown operator selects nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuop import selectors

OBJECT = {
    "matchLabels": {"app": "llm"},
    "matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["batch", "spot"]},
        {"key": "zone", "operator": "In", "values": ["a", "b"]},
        {"key": "gpu", "operator": "Exists"},
        {"key": "preemptible", "operator": "DoesNotExist"},
    ],
}
STRING = "app=llm,tier notin (batch,spot),zone in (a,b),gpu,!preemptible"
labels = st.dictionaries(
    st.sampled_from(["app", "tier", "zone", "gpu", "preemptible"]),
    st.sampled_from(["llm", "batch", "spot", "a", "b", "c"]),
)


@given(labels)
def test_an_object_and_its_string_select_the_same_labels(found: dict[str, str]) -> None:
    as_object = selectors.matches(selectors.from_label_selector(OBJECT), found)
    assert as_object == selectors.matches(selectors.parse(STRING), found)


def test_the_api_servers_rules() -> None:
    assert selectors.matches(selectors.parse("tier!=batch"), {})
    assert selectors.matches(selectors.parse("gen>3"), {"gen": "4"})
    assert not selectors.matches(selectors.parse("gen>3"), {"gen": "four"})
    assert selectors.matches(selectors.parse(""), {"any": "thing"})
    odd = {"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}
    assert not selectors.matches(selectors.from_label_selector(odd), {"app": "2"})
