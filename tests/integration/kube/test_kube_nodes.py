"""Cordon and uncordon remembering the initial state, conflicts retried on fresh reads,
labels and annotations by strategic merge patch."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.kube import client, errors, nodes
from gpuop_sim import ApiServer
from tests.support import kube_objects as support

RECORD = nodes.INITIAL_STATE_ANNOTATION


def patches(server: ApiServer, name: str) -> list[int]:
    """The statuses of the PATCH requests made to a node, in order."""
    return [
        record.status
        for record in server.request_log
        if record.method == "PATCH" and record.path == f"/api/v1/nodes/{name}"
    ]


async def test_cordon_of_a_schedulable_node_records_that_it_was_schedulable(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))

    already = await nodes.cordon(kube, "node-1")

    node = await nodes.get(kube, "node-1")
    assert already is False
    assert nodes.is_unschedulable(node)
    assert nodes.annotations_of(node)[RECORD] == "false"


async def test_uncordon_restores_schedulability_and_forgets_the_record(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))
    await nodes.cordon(kube, "node-1")

    schedulable = await nodes.uncordon(kube, "node-1")

    node = await nodes.get(kube, "node-1")
    assert schedulable is True
    assert not nodes.is_unschedulable(node)
    assert RECORD not in nodes.annotations_of(node)


async def test_a_node_that_started_cordoned_stays_cordoned_after_uncordon(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1", unschedulable=True))

    already = await nodes.cordon(kube, "node-1")
    schedulable = await nodes.uncordon(kube, "node-1")

    node = await nodes.get(kube, "node-1")
    assert already is True
    assert schedulable is False
    assert nodes.is_unschedulable(node)
    assert RECORD not in nodes.annotations_of(node)


async def test_a_repeated_cordon_keeps_the_first_record(
    server: ApiServer, kube: client.Kube
) -> None:
    """A cordon re-run after a crash finds the node unschedulable because of its own first
    run; it must not record that as the initial state."""
    server.seed(support.node("node-1"))
    await nodes.cordon(kube, "node-1")
    writes = len(patches(server, "node-1"))

    again = await nodes.cordon(kube, "node-1")
    schedulable = await nodes.uncordon(kube, "node-1")

    assert again is False
    assert len(patches(server, "node-1")) == writes + 1  # only the uncordon wrote
    assert schedulable is True


async def test_upstream_annotation_key_can_be_used(server: ApiServer, kube: client.Kube) -> None:
    upstream = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
    server.seed(support.node("node-1", unschedulable=True))

    await nodes.cordon(kube, "node-1", annotation=upstream)

    node = await nodes.get(kube, "node-1")
    assert nodes.annotations_of(node) == {upstream: "true"}


async def test_a_409_is_retried_on_a_fresh_read_that_changes_the_decision(
    server: ApiServer, kube: client.Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An administrator cordons the node between our read and our write: the stale patch
    gets 409, and the fresh read shows the node was unschedulable before we touched it."""
    server.seed(support.node("node-1"))
    read = nodes.get
    interfered = False

    async def read_then_interfere(kube: client.Kube, name: str) -> dict[str, Any]:
        nonlocal interfered
        node = await read(kube, name)
        if not interfered:
            interfered = True
            await nodes.patch(kube, name, {"spec": {"unschedulable": True}})
        return node

    monkeypatch.setattr(nodes, "get", read_then_interfere)

    already = await nodes.cordon(kube, "node-1")

    assert patches(server, "node-1") == [200, 409, 200]
    assert already is True
    assert nodes.annotations_of(await read(kube, "node-1"))[RECORD] == "true"


async def test_conflicts_that_never_end_raise_conflict_after_the_attempts(
    server: ApiServer, kube: client.Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.seed(support.node("node-1"))
    read = nodes.get

    async def read_then_interfere(kube: client.Kube, name: str) -> dict[str, Any]:
        node = await read(kube, name)
        server.seed({**node, "metadata": {**node["metadata"], "labels": {"touched": "yes"}}})
        return node

    monkeypatch.setattr(nodes, "get", read_then_interfere)

    with pytest.raises(errors.Conflict):
        await nodes.cordon(kube, "node-1")

    assert patches(server, "node-1") == [409] * nodes.CONFLICT_ATTEMPTS


async def test_cordon_of_a_missing_node_is_not_found(kube: client.Kube) -> None:
    with pytest.raises(errors.NotFound):
        await nodes.cordon(kube, "nowhere")


async def test_labels_are_set_and_removed_leaving_others_alone(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1", labels={"keep": "me", "old": "x"}))

    await nodes.set_labels(kube, "node-1", {"gpuop.io/driver-upgrade-state": "cordon-required"})
    written = await nodes.set_labels(
        kube, "node-1", {"old": None, "gpuop.io/driver-upgrade-state": "drain-required"}
    )

    assert nodes.labels_of(written) == {
        "keep": "me",
        "gpuop.io/driver-upgrade-state": "drain-required",
    }
    assert [r.content_type for r in server.request_log if r.method == "PATCH"] == [
        "application/strategic-merge-patch+json"
    ] * 2


async def test_annotations_are_set_and_removed(server: ApiServer, kube: client.Kube) -> None:
    server.seed(support.node("node-1"))

    await nodes.set_annotations(kube, "node-1", {"a": "1", "b": "2"})
    written = await nodes.set_annotations(kube, "node-1", {"a": None})

    assert nodes.annotations_of(written) == {"b": "2"}


async def test_removing_an_absent_label_is_a_no_op(server: ApiServer, kube: client.Kube) -> None:
    server.seed(support.node("node-1", labels={"keep": "me"}))
    before = (await nodes.get(kube, "node-1"))["metadata"]["resourceVersion"]

    written = await nodes.set_labels(kube, "node-1", {"absent": None})

    assert written["metadata"]["resourceVersion"] == before
