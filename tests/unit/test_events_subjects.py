"""Subject names: the node-token encoding is reversible and rejects what Kubernetes rejects."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuop.events import subjects
from gpuop.events.subjects import InvalidSubject, Kind, Subject

LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
NODE_NAMES = st.lists(LABEL, min_size=1, max_size=5).map(".".join)
TOKENS = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,15}[a-z0-9])?", fullmatch=True)
PREFIXES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,10}", fullmatch=True)
INVALID_NODE_NAMES = st.one_of(
    st.just(""),
    st.just("a" * 254),
    NODE_NAMES.map(lambda n: n.upper() if n.upper() != n else f"{n}_x"),
    NODE_NAMES.map(lambda n: f"-{n}"),
    NODE_NAMES.map(lambda n: f"{n}-"),
    NODE_NAMES.map(lambda n: f"{n}..{n}"),
    NODE_NAMES.map(lambda n: f"{n}."),
    NODE_NAMES.map(lambda n: f"{n}_x"),
    NODE_NAMES.flatmap(lambda n: st.sampled_from(" */>*\t").map(lambda c: f"{n}{c}{n}")),
)


@given(NODE_NAMES)
def test_node_names_round_trip_through_their_token(node: str) -> None:
    token = subjects.encode_node(node)
    assert "." not in token
    assert subjects.decode_node(token) == node


@given(INVALID_NODE_NAMES)
def test_invalid_node_names_are_refused(node: str) -> None:
    with pytest.raises(InvalidSubject):
        subjects.encode_node(node)


@given(
    PREFIXES,
    st.sampled_from([Kind.EVENT, Kind.COMMAND]),
    TOKENS,
    st.one_of(NODE_NAMES, st.just(subjects.CLUSTER)),
    TOKENS,
)
def test_parsing_a_formatted_subject_gives_it_back(
    prefix: str, kind: Kind, group: str, node: str, name: str
) -> None:
    subject = Subject(prefix, kind, group, node, name)
    assert subjects.parse_subject(str(subject)) == subject
    assert subjects.node_key(str(subject)) == subjects.encode_node(node)


def test_cluster_token_is_kept_as_is() -> None:
    assert subjects.encode_node(subjects.CLUSTER) == subjects.CLUSTER
    assert subjects.decode_node(subjects.CLUSTER) == subjects.CLUSTER
    assert subjects.event_subject("upgrade", subjects.CLUSTER, "rollout-started") == (
        "gpuop.evt.upgrade._cluster.rollout-started"
    )


def test_subjects_follow_the_design() -> None:
    assert subjects.event_subject("driver", "gpu-1.example.com", "loaded") == (
        "gpuop.evt.driver.gpu-1_example_com.loaded"
    )
    assert subjects.command_subject("driver-manager", "n1", "unload", prefix="prod") == (
        "prod.cmd.driver-manager.n1.unload"
    )
    assert subjects.dead_letter_subject("gpuop.evt.driver.n1.loaded") == (
        "gpuop.dlq.gpuop.evt.driver.n1.loaded"
    )
    assert subjects.stream_filter(Kind.EVENT) == "gpuop.evt.>"
    assert subjects.events_filter("upgrade") == "gpuop.evt.upgrade.*.*"
    assert subjects.commands_filter("operands", "a.b") == "gpuop.cmd.operands.a_b.*"


@pytest.mark.parametrize(
    "subject",
    [
        "gpuop.evt.driver.n1",
        "gpuop.evt.driver.n1.loaded.extra",
        "gpuop.xyz.driver.n1.loaded",
        "gpuop.dlq.driver.n1.loaded",
        "gpuop.evt.Driver.n1.loaded",
        "gpuop.evt.driver.N1.loaded",
        "gpuop.evt.driver.n1.*",
        "gpuop.evt.driver.n1.>",
        "gp.uop.evt.driver.n1",
        "",
    ],
)
def test_malformed_subjects_are_refused(subject: str) -> None:
    with pytest.raises(InvalidSubject):
        subjects.parse_subject(subject)


def test_node_key_never_fails() -> None:
    assert subjects.node_key("gpuop.evt.driver.a_b.loaded") == "a_b"
    assert subjects.node_key("garbage") == "garbage"
