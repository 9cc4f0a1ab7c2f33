"""What `gpuop upgrade status` and `gpuop upgrade plan` print: one JSON document (`--json`)
or a table for people, both built from a `snapshots.Snapshot` (and a `planning.Forecast`).

A node's state is its `gpuop.io/driver-upgrade-state` label (or its latest state change in
the log), except that a node whose driver differs from the desired one shows as
`upgrade-required` while its label still tells an earlier rollout's `upgrade-done` (the label
changes at admission), and a node without a label that runs the desired driver shows as
`upgrade-done`: upstream's reading of the label.

A waiting node that admission leaves out shows as skipped, with why (`skipped`: its skip
labels cover every driver it needs, or it is cordoned under `cordonedNodes: skip`), and the
summary counts such nodes; the policy's `status.skipped` is the orchestrator's own count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from gpuop.cli import planning
from gpuop.cli.snapshots import NodeView, Snapshot, running_versions
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import admission
from gpuop.saga.upgrade.records import components_to_upgrade

S = UpgradeState
Obj = dict[str, Any]


def state_of(view: NodeView, spec: GPUClusterPolicySpec | None) -> UpgradeState | None:
    """The node's state as the report shows it (see the module docstring)."""
    if spec is None or view.state not in (None, S.UPGRADE_DONE):
        return view.state
    if view.driver is None:
        return view.state
    gpu, ofed = spec.driver.components_of(pool_of(view, spec))
    outdated = view.driver != gpu.version or (
        ofed is not None and view.ofed is not None and view.ofed != ofed.version
    )  # an OFED version no one reported does not count
    return S.UPGRADE_REQUIRED if outdated else S.UPGRADE_DONE


def pool_of(view: NodeView, spec: GPUClusterPolicySpec | None) -> str | None:
    """The driver pool whose selector matches the node's labels; None: the defaults."""
    found = spec.driver.pool_for(view.labels) if spec is not None else None
    return found.name if found is not None else None


def node_status(view: NodeView) -> admission.NodeStatus:
    """What admission would read of the node."""
    return admission.NodeStatus(
        ready=view.ready, unschedulable=view.unschedulable, skip=view.skip, labels=view.labels
    )


def skipped(view: NodeView, spec: GPUClusterPolicySpec | None) -> str | None:
    """Why admission leaves the waiting node out (`admission.skip_reason`), or None. The
    drivers it needs are those whose reported version differs from the policy's (one not
    reported counts, as its saga would upgrade it)."""
    if spec is None or state_of(view, spec) is not S.UPGRADE_REQUIRED:
        return None
    needed = components_to_upgrade(spec, running_versions(view), pool_of(view, spec))
    return admission.skip_reason(needed, node_status(view), spec.upgrade_policy)


def managed(snapshot: Snapshot) -> list[NodeView]:
    """The nodes the policy selects, and any other one still in an upgrade."""
    spec = snapshot.policy.spec if snapshot.policy else None
    found = []
    for view in snapshot.nodes.values():
        state = state_of(view, spec)
        if view.selected or state not in (None, S.UPGRADE_DONE, S.UPGRADE_REQUIRED):
            found.append(view)
    return found


def counts(snapshot: Snapshot) -> dict[str, int]:
    """Managed nodes per state, in the order of the upgrade."""
    spec = snapshot.policy.spec if snapshot.policy else None
    counted = Counter(str(state_of(v, spec) or "unknown") for v in managed(snapshot))
    order = [*map(str, UpgradeState), "unknown"]
    return {state: counted[state] for state in order if counted[state]}


def status_document(snapshot: Snapshot) -> Obj:
    policy = snapshot.policy
    spec = policy.spec if policy else None
    nodes = []
    for view in snapshot.nodes.values():
        state = state_of(view, spec)
        attempt, reason = view.attempt, view.reason
        if state != view.state and spec is not None:  # the label tells an earlier rollout
            wanted = _wanted(spec, pool_of(view, spec))
            attempt, reason = None, f"runs {view.driver}, the policy asks for {wanted}"
        nodes.append(
            {
                "node": view.name,
                "pool": pool_of(view, spec),
                "state": str(state or "") or None,
                "attempt": attempt,
                "driver": view.driver,
                "reason": reason,
                "ready": view.ready,
                "unschedulable": view.unschedulable,
                "selected": view.selected,
                "skipped": skipped(view, spec),
            }
        )
    counted = counts(snapshot)
    left_out = sum(skipped(view, spec) is not None for view in managed(snapshot))
    document: Obj = {
        "sources": list(snapshot.sources),
        "policy": _policy_document(snapshot),
        "rollout": None,
        "nodes": nodes,
        "summary": {
            "nodes": sum(counted.values()),
            "done": counted.get(S.UPGRADE_DONE, 0),
            "failed": counted.get(S.UPGRADE_FAILED, 0),
            "skipped": left_out,
            "counts": counted,
        },
    }
    if snapshot.rollout is not None:
        rollout = snapshot.rollout
        document["rollout"] = {
            "id": rollout.rollout_id,
            "targetVersions": rollout.target_versions,
            "done": rollout.done,
            "failed": rollout.failed,
            "total": rollout.total,
            "skipped": rollout.skipped,
            "ended": rollout.ended or None,
        }
    return document


def _policy_document(snapshot: Snapshot) -> Obj | None:
    policy = snapshot.policy
    if policy is None:
        return None
    document: Obj = {"name": policy.name, "invalid": policy.invalid or None}
    if policy.spec is not None:
        upgrade = policy.spec.upgrade_policy
        document.update(
            versions=_versions(policy.spec),
            paused=upgrade.paused,
            maxParallelUpgrades=upgrade.max_parallel_upgrades,
            maxUnavailable=upgrade.max_unavailable,
            nodeSelector=upgrade.node_selector,
            pools=_pools_document(policy.spec),
        )
    document["conditions"] = [
        {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
        for c in policy.status.conditions
    ]
    document["counts"] = dict(policy.status.nodes)
    document["skipped"] = policy.status.skipped
    document["rollout"] = policy.status.rollout.id if policy.status.rollout else None
    document["poolProgress"] = [
        p.model_dump(mode="json", by_alias=True) for p in policy.status.pools
    ]
    return document


def _wanted(spec: GPUClusterPolicySpec, pool: str | None = None) -> str:
    return ", ".join(f"{c} {v}" for c, v in _versions(spec, pool).items())


def _versions(spec: GPUClusterPolicySpec, pool: str | None = None) -> dict[str, str]:
    gpu, ofed = spec.driver.components_of(pool)
    found = {"gpu": gpu.version}
    if ofed is not None:
        found["ofed"] = ofed.version
    return found


def _pools_document(spec: GPUClusterPolicySpec) -> list[Obj]:
    return [
        {
            "name": pool.name,
            "nodeSelector": pool.node_selector,
            "versions": _versions(spec, pool.name),
            "paused": pool.upgrade_policy.paused,
            "maxParallelUpgrades": pool.upgrade_policy.max_parallel_upgrades,
        }
        for pool in spec.driver.pools
    ]


def status_lines(snapshot: Snapshot) -> list[str]:
    document = status_document(snapshot)
    lines = []
    policy = document["policy"]
    if policy is not None:
        lines.append(f"GPUClusterPolicy {policy['name']}: {_policy_line(policy)}")
        for pool in policy.get("pools") or ():
            versions = ", ".join(f"{c} {v}" for c, v in pool["versions"].items())
            parallel = pool["maxParallelUpgrades"]
            own = "" if parallel is None else f", maxParallelUpgrades {parallel}"
            paused = "  PAUSED" if pool["paused"] else ""
            lines.append(
                f"  pool {pool['name']}: {versions}{own}, nodes: {pool['nodeSelector']}{paused}"
            )
        for condition in policy["conditions"]:
            reason = f"{condition['status']} ({condition['reason']})"
            lines.append(f"  {condition['type']:<12} {reason:<30} {condition['message']}")
    rollout = document["rollout"]
    if rollout is None and policy is not None and policy.get("rollout"):
        lines.append(f"rollout {policy['rollout']}")
    if rollout is not None:
        ended = f", {rollout['ended']}" if rollout["ended"] else ""
        lines.append(
            f"rollout {rollout['id']}: {rollout['done']} of {rollout['total']} done, "
            f"{rollout['failed']} failed, {rollout['skipped']} skipped{ended}"
        )
    pooled = policy is not None and bool(policy.get("pools"))
    rows = [
        (
            n["node"],
            *((n["pool"] or "default",) if pooled else ()),
            n["state"] or "-",
            n["driver"] or "-",
            "-" if n["attempt"] is None else str(n["attempt"]),
            _node_note(n),
        )
        for n in document["nodes"]
    ]
    lines.append("")
    header = ("NODE", *(("POOL",) if pooled else ()), "STATE", "DRIVER", "ATTEMPT", "REASON")
    lines.extend(table(header, rows))
    summary = document["summary"]
    per_state = ", ".join(f"{count} {state}" for state, count in summary["counts"].items())
    lines.append("")
    left_out = f"; {summary['skipped']} skipped" if summary["skipped"] else ""
    lines.append(f"{summary['nodes']} nodes: {per_state or 'none'}{left_out}")
    return lines


def _policy_line(policy: Obj) -> str:
    if policy.get("invalid"):
        return f"INVALID: {policy['invalid']}"
    versions = ", ".join(f"{c} {v}" for c, v in policy["versions"].items())
    selector = policy["nodeSelector"] or "every GPU node"
    paused = "  PAUSED" if policy["paused"] else ""
    return (
        f"{versions}, maxParallelUpgrades {policy['maxParallelUpgrades']}, "
        f"maxUnavailable {policy['maxUnavailable']}, nodes: {selector}{paused}"
    )


def _node_note(node: Obj) -> str:
    notes = [] if node["selected"] else ["not selected by nodeSelector"]
    if not node["ready"]:
        notes.append("NotReady")
    if node["skipped"]:
        notes.append(node["skipped"])
    if node["reason"]:
        notes.append(node["reason"])
    return "; ".join(notes)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, the last one unpadded."""
    rows = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    ]


def clock(seconds: float) -> str:
    """`1:02:03`, `2:03`, or `4.2s` under ten seconds (but `0:00`)."""
    if 0 < seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def plan_document(
    snapshot: Snapshot,
    spec: GPUClusterPolicySpec,
    spent: dict[UpgradeState, planning.Duration],
    forecast: planning.Forecast,
) -> Obj:
    upgrade = spec.upgrade_policy
    total = len([v for v in snapshot.nodes.values() if v.selected])
    return {
        "policy": snapshot.policy.name if snapshot.policy else None,
        "versions": _versions(spec),
        "paused": upgrade.paused,
        "maxParallelUpgrades": upgrade.max_parallel_upgrades,
        "maxUnavailable": upgrade.max_unavailable,
        "maxUnavailableNodes": upgrade.max_unavailable_of(total),
        "nodeSelector": upgrade.node_selector,
        "wavesBy": upgrade.waves.topology_label or None,
        "maintenanceWindows": [
            f"{','.join(w.days)} {w.start}-{w.end} {w.time_zone}"
            for w in upgrade.maintenance_windows
        ],
        "nodes": {
            "selected": total,
            "alreadyDone": list(forecast.already_done),
            "underWay": list(forecast.under_way),
            "neverAdmitted": list(forecast.never_admitted),
        },
        "waves": [
            {
                "wave": wave.number,
                "startSeconds": round(wave.start, 1),
                "nodes": list(wave.nodes),
                "canary": list(wave.canary),
            }
            for wave in forecast.waves
        ],
        "nodeSeconds": round(forecast.node_seconds, 1),
        "makespanSeconds": round(forecast.makespan, 1),
        "durations": {
            str(state): {"seconds": round(d.seconds, 1), "samples": d.samples}
            for state, d in spent.items()
        },
    }


def plan_lines(document: Obj) -> list[str]:
    versions = ", ".join(f"{c} {v}" for c, v in document["versions"].items())
    nodes = document["nodes"]
    lines = [
        f"plan for GPUClusterPolicy {document['policy']}: {versions} on "
        f"{document['nodes']['selected']} selected GPU nodes",
        f"  maxParallelUpgrades {document['maxParallelUpgrades']}, maxUnavailable "
        f"{document['maxUnavailable']} ({document['maxUnavailableNodes']} nodes); "
        f"{len(nodes['alreadyDone'])} done already, {len(nodes['underWay'])} under way",
    ]
    if document["paused"]:
        lines.append("  the rollout is PAUSED: this is what `gpuop upgrade resume` would do")
    if document["wavesBy"]:
        lines.append(f"  one failure domain at a time, by the node label {document['wavesBy']}")
    if document["maintenanceWindows"]:
        windows = "; ".join(document["maintenanceWindows"])
        lines.append(f"  admitted only in maintenance windows: {windows}")
        lines.append("  (the times below leave the windows out: they count while admission runs)")
    rows = [
        (
            str(wave["wave"]),
            clock(wave["startSeconds"]),
            ", ".join(f"{n} (canary)" if n in wave["canary"] else n for n in wave["nodes"]),
        )
        for wave in document["waves"]
    ]
    lines.append("")
    if rows:
        lines.extend(table(("WAVE", "START", "NODES"), rows))
    elif not nodes["underWay"]:
        lines.append(f"nothing to upgrade: every selected node runs {versions}")
    if nodes["neverAdmitted"]:
        lines.append(f"never admitted (NotReady or skipped): {', '.join(nodes['neverAdmitted'])}")
    measured = sum(d["samples"] > 0 for d in document["durations"].values())
    steps = ", ".join(
        f"{state.removesuffix('-required')} {clock(d['seconds'])}"
        for state, d in document["durations"].items()
    )
    lines.append("")
    lines.append(
        f"per node {clock(document['nodeSeconds'])} ({measured} of "
        f"{len(document['durations'])} states measured from the event log): {steps}"
    )
    lines.append(f"predicted makespan {clock(document['makespanSeconds'])}; nothing was changed")
    return lines
