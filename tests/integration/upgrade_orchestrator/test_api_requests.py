"""What a rollout costs the API server, counted per upgraded node: the real orchestrator over
the simulated cluster (GPU workloads under budgets, a training Job the policy waits for,
drains), with fake node agents (`fleets.rollout`). The bounds are counts of requests, so
they hold on any machine; each names the fix it keeps:

- no LIST of every pod, ever, and pod LISTs per node bounded by the steps that plan from
  one (waiting for jobs, deleting GPU pods, draining), not by the decisions or the time a
  wait takes: those steps follow the node's pods with one watch each;
- no GET of the node per Kubernetes Event or per cordon and uncordon: the state label's
  write returns the node;
- the policy status written when more than the progress changed, the progress at most every
  `PROGRESS_INTERVAL`, not once per transition;
- and the total, which the scale benchmark reports (`tests/bench/scale.py`).
"""

from __future__ import annotations

from pathlib import Path

from gpuop.sim import RequestKind
from tests.integration.upgrade_orchestrator import fleets

NODES = 6
TRANSITIONS = 9
"""upgrade-required -> cordon -> wait-for-jobs -> pod-deletion -> drain -> operands-pause ->
driver-reload -> validation -> uncordon -> upgrade-done."""
EXCEPT_EVICTIONS_PER_NODE = 30
"""A state label and an Event per transition (18), cordon and uncordon (2), a LIST and a
WATCH of the node's pods for each of the three steps that need them (6), and a share of
what the rollout costs once (the Lease, the node and policy watches, the policy status)."""


def per_node(run: fleets.Rollout, verb: str, resource: str) -> float:
    found = sum(
        c for kind, c in run.requests.items() if (kind.verb, kind.resource) == (verb, resource)
    )
    return found / run.upgraded


async def test_a_rollout_costs_a_bounded_number_of_requests_per_node(tmp_path: Path) -> None:
    run = await fleets.rollout(tmp_path, nodes=NODES, max_parallel=2, timeout=50)

    assert run.upgraded == NODES  # every node reached upgrade-done
    assert run.unfiltered_pod_lists == 0
    assert per_node(run, "LIST", "pods") <= 3
    assert per_node(run, "WATCH", "pods") <= 3
    assert per_node(run, "GET", "nodes") <= 0.5  # a cordon whose node changed meanwhile
    assert per_node(run, "PATCH", "nodes") <= TRANSITIONS + 2
    assert per_node(run, "POST", "events") <= TRANSITIONS
    assert per_node(run, "PATCH", "gpuclusterpolicies/status") <= 2
    evictions = run.requests[RequestKind("POST", "pods/eviction", "resource")]
    assert sum(run.requests.values()) - evictions <= EXCEPT_EVICTIONS_PER_NODE * NODES, sorted(
        run.requests.items()
    )
