"""The streams' and buckets' byte limits as one budget (issue 17, finding 6): shares, the
replicas they are divided by, bad limits refused by name, the default budget inside the
shipped account, and the drift that brings a running server's streams to them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy

from gpuop.bus import Buckets, grants, streams
from gpuop.events import subjects

ACCOUNTS = Path(__file__).parents[2] / "deploy" / "nats" / "accounts.conf"
UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def test_every_stream_and_bucket_has_a_share_and_the_shares_fill_the_budget() -> None:
    parts = {*subjects.Kind, *Buckets}
    assert set(streams.SHARES) == parts
    assert sum(streams.SHARES.values()) == pytest.approx(1.0)
    limits = streams.StoreLimits()
    assert sum(limits.share(part) for part in parts) <= limits.store_bytes


def test_the_default_budget_fits_the_shipped_account_even_counted_twice_for_one_stream() -> None:
    """A create of an existing stream counts its limit a second time, so the budget plus
    the largest share must fit the account's file store."""
    match = re.search(r"max_file:\s*(\d+)(KB|MB|GB)", ACCOUNTS.read_text())
    assert match, f"{ACCOUNTS} names no max_file"
    account = int(match[1]) * UNITS[match[2]]
    limits = streams.DEFAULT_LIMITS
    largest = max(limits.share(part) for part in streams.SHARES)
    assert limits.store_bytes + largest <= account


def test_the_event_log_keeps_two_hours_of_heartbeats_per_node_and_the_others_no_bound() -> None:
    events, commands, dead_letters = streams.layouts("gpuop")
    assert events.max_msgs_per_subject == streams.DEFAULT_EVENTS_PER_SUBJECT == 2 * 3600 // 30
    assert commands.max_msgs_per_subject == dead_letters.max_msgs_per_subject == -1
    assert events.share == streams.DEFAULT_LIMITS.share(subjects.Kind.EVENT)


@pytest.mark.security
def test_one_nodes_agents_flooding_every_event_name_they_have_fit_in_the_logs_share() -> None:
    """Issue 37, finding 4: each of a node's exact event names keeps `events_per_subject`
    messages, each at most `EVENT_BYTES`; all of them together must leave the log's older
    messages (the audit trail) in place, which 1 MB events did not (4.5 GB for the driver
    domain alone)."""
    events, commands, dead_letters = streams.layouts("gpuop")
    assert events.max_msg_size == streams.EVENT_BYTES
    assert commands.max_msg_size == dead_letters.max_msg_size == -1
    names = {
        subject
        for role in grants.NODE_ROLES
        for subject in grants.for_identity(grants.Identity(role, "gpu-1")).publish
        if subject.startswith("gpuop.evt.")
    }
    assert not any("*" in name or ">" in name for name in names)
    flood = len(names) * streams.DEFAULT_EVENTS_PER_SUBJECT * streams.EVENT_BYTES
    assert flood < 0.75 * events.share, (len(names), flood, events.share)
    print(
        f"\none node's five agents flooding each of their {len(names)} event names: at most "
        f"{flood / streams.GiB:.2f} GiB of the log's {events.share / streams.GiB:.2f} GiB"
    )


def test_a_replicated_stream_reserves_its_share_over_all_its_replicas() -> None:
    assert streams.replica_bytes(3 * streams.GiB, 3) == streams.GiB
    assert streams.replica_bytes(3 * streams.GiB, 1) == 3 * streams.GiB
    assert streams.replica_bytes(2, 5) == 1, "never 0, which JetStream reads as no limit"


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        ({"store_bytes": 1000}, "store_bytes must be at least 1 MiB, not 1000"),
        ({"events_per_subject": 0}, "events_per_subject must be 1 or more, not 0"),
    ],
)
def test_limits_out_of_range_are_refused_naming_the_field(
    arguments: dict[str, int], refusal: str
) -> None:
    with pytest.raises(ValueError, match=refusal):
        streams.StoreLimits(**arguments)


def test_limits_drift_when_they_differ_and_an_unset_limit_is_no_limit() -> None:
    want = {"max_bytes": 1024, "max_msgs_per_subject": 240, "discard": DiscardPolicy.OLD}
    same = {"max_bytes": 1024, "max_msgs_per_subject": 240, "discard": "old"}
    assert streams.drift(same, want) == {}
    unset = {"max_bytes": None, "max_msgs_per_subject": None, "discard": None}
    assert streams.drift(unset, {"max_bytes": -1, "max_msgs_per_subject": -1}) == {}
    assert set(streams.drift(unset, want)) == {"max_bytes", "max_msgs_per_subject"}
    refusing = {**same, "discard": DiscardPolicy.NEW}
    assert set(streams.drift(refusing, want)) == {"discard"}
    assert {"max_bytes", "max_msgs_per_subject", "discard"} <= streams.DRIFT_UPDATABLE
