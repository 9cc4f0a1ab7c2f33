"""The sixteen-node rollout end to end and the rollout through twenty leader SIGKILLs
(tests/e2e/test_rollout_e2e.py), on the real control plane instead of the simulated one:
KWOK GPU nodes, the GPU Deployments under PodDisruptionBudgets and the Job placed by the
real scheduler, evictions through the real eviction API and its disruption controller,
leader election on real Leases, the GPUClusterPolicy CRD on the real apiserver, the chart
installed by the real Helm, and the orchestrator and discovery's cluster role acting with
their chart ServiceAccount's own token (a missing permission fails the rollout). The same
invariants and replay hold on the exported log."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuop.bus import NatsServer
from tests.support import fleet
from tests.support.control_plane import ControlPlane
from tests.support.rollout_scenarios import roll_sixteen_nodes, roll_through_leader_kills

pytestmark = [pytest.mark.nats, pytest.mark.real_cluster]


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path / "control-plane") as running:
        yield running


ORCHESTRATOR = f"system:serviceaccount:{fleet.RELEASE_NAMESPACE}:gpuop-upgrade-orchestrator"
LABELER = f"system:serviceaccount:{fleet.RELEASE_NAMESPACE}:gpuop-discovery-cluster"


def requests_by(plane: ControlPlane, user: str) -> Counter[tuple[str, str, int]]:
    """The audit log's requests of `user`: (verb, resource[/subresource], status code)."""
    found: Counter[tuple[str, str, int]] = Counter()
    for event in plane.audit_events():
        if event["user"]["username"] != user:
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        found[(event["verb"], resource, event["responseStatus"]["code"])] += 1
    return found


@pytest.mark.timeout(480)
async def test_sixteen_kwok_nodes_roll_on_the_real_control_plane(
    nats_server: NatsServer, tmp_path: Path, plane: ControlPlane
) -> None:
    await roll_sixteen_nodes(nats_server, tmp_path, plane)

    orchestrator = requests_by(plane, ORCHESTRATOR)
    labeler = requests_by(plane, LABELER)
    print(f"\norchestrator's requests: {sorted(orchestrator.items())}")
    print(f"discovery cluster role's requests: {sorted(labeler.items())}")
    # the drains went through the real eviction API, as the chart's ServiceAccount
    assert orchestrator[("create", "pods/eviction", 201)] >= 16, orchestrator
    assert any(verb in ("update", "patch") and what == "leases" for verb, what, _ in orchestrator)
    assert any(verb == "patch" and what == "nodes" for verb, what, _ in labeler), labeler
    refused = {key: n for key, n in (orchestrator + labeler).items() if key[2] in (401, 403)}
    assert not refused, f"requests the real authorizer refused: {refused}"


@pytest.mark.timeout(540)
async def test_the_rollout_survives_twenty_leader_kills_on_real_leases(
    nats_server: NatsServer, tmp_path: Path, plane: ControlPlane
) -> None:
    await roll_through_leader_kills(nats_server, tmp_path, plane)
