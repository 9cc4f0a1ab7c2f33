"""What `gpuop upgrade` knows of a rollout, read from Kubernetes, from the event log, or both.

Read-only. `read_kube` takes the GPUClusterPolicy the orchestrator follows (the first by
name, or the one named), its status, and the GPU nodes with their
`gpuop.io/driver-upgrade-state` label, driver version label, skip labels and whether the
policy's `nodeSelector` selects them. `read_events` takes the same from the public upgrade events
(each node's latest state change, the policy last applied, the rollout events) and the
nodes' inventories, through ephemeral consumers, so the read-only `observer` user will do.
`merge` keeps Kubernetes' view of the nodes and adds what only the log knows (attempt,
reason). `gpuop upgrade status` prints a `Snapshot`; `gpuop upgrade plan` forecasts from one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuop.bus import Bus
from gpuop.cli.errors import CommandFailed
from gpuop.cli.planning import StateChange
from gpuop.events import MalformedMessage, UnknownEventType, decode_on, subjects
from gpuop.events import upgrade as up
from gpuop.events.driver import Component
from gpuop.events.hardware import HardwareDiscovered
from gpuop.kube import client, customobjects, errors, nodes
from gpuop.policy import GPUClusterPolicySpec, PolicyInvalid, PolicyStatus, selectors
from gpuop.policy import validation as policy_validation
from gpuop.saga import admission
from gpuop.saga.actions import STATE_LABEL

GPU_NODES = "nvidia.com/gpu.present=true"
"""The nodes the orchestrator watches (its `observing.GPU_NODE_SELECTOR`)."""
DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
"""The running GPU driver, as discovery labels it."""
RESOURCE = customobjects.GPU_CLUSTER_POLICIES


@dataclass
class NodeView:
    """One GPU node in a rollout."""

    name: str
    state: up.UpgradeState | None = None
    """Its upgrade state; None: no rollout touched it (or its label is not gpuop's)."""
    attempt: int | None = None
    driver: str | None = None
    """The GPU driver it runs, when known."""
    ofed: str | None = None
    """The OFED driver it runs, when known."""
    kernel: str | None = None
    """The kernel release it runs (`status.nodeInfo.kernelVersion`, or discovery's
    inventory), when known."""
    reason: str = ""
    """Why it moved to its state, from the log."""
    rollout: str | None = None
    ready: bool = True
    unschedulable: bool = False
    selected: bool = True
    """The policy's `nodeSelector` selects it."""
    skip: frozenset[Component] = frozenset()
    """Components its skip labels keep out of upgrades (`admission.skipped_by`)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Its labels (the waves' topology label among them), when read from Kubernetes."""
    inventory: HardwareDiscovered | None = None
    """Discovery's latest inventory of it, when read from the event log: what `auto`
    resolves its kernel modules from (`gpuop.policy.flavours`)."""


@dataclass
class PolicyView:
    """The followed GPUClusterPolicy."""

    name: str
    spec: GPUClusterPolicySpec | None
    """None when the spec is invalid (`invalid` says why) or the log recorded none."""
    invalid: str = ""
    status: PolicyStatus = field(default_factory=PolicyStatus)
    annotations: dict[str, str] = field(default_factory=dict)
    generation: int | None = None


@dataclass
class RolloutView:
    """The latest rollout, as its public events tell it."""

    rollout_id: str
    target_versions: dict[str, str] = field(default_factory=dict)
    done: int = 0
    failed: int = 0
    total: int = 0
    skipped: int = 0
    """Nodes admission leaves out, as the latest progress report counts them."""
    ended: str = ""
    """`completed`, `failed: <reason>`, or empty while it runs."""


@dataclass
class Snapshot:
    policy: PolicyView | None = None
    nodes: dict[str, NodeView] = field(default_factory=dict)
    rollout: RolloutView | None = None
    changes: list[StateChange] = field(default_factory=list)
    """Every public state change in the log, for measuring durations."""
    sources: tuple[str, ...] = ()
    """`kubernetes`, `events`."""


async def find_policy(kube: client.Kube, name: str | None = None) -> dict[str, Any]:
    """The policy named, or the one the orchestrator follows (the first by name);
    `CommandFailed` when there is none."""
    try:
        found = await customobjects.list_objects(kube, RESOURCE)
    except errors.NotFound:
        raise CommandFailed(
            "no GPUClusterPolicy: the CRD gpuclusterpolicies.gpuop.io is not installed "
            "(kubectl apply -f deploy/crds/)"
        ) from None
    by_name = {str(obj["metadata"]["name"]): obj for obj in found}
    if name is not None:
        if name not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise CommandFailed(f"--policy {name}: no such GPUClusterPolicy (found: {known})")
        return by_name[name]
    if not by_name:
        raise CommandFailed(
            "no GPUClusterPolicy in the cluster: gpuop has nothing to upgrade; create one "
            "(see deploy/crds) with spec.driver.gpu.version"
        )
    return by_name[sorted(by_name)[0]]


def policy_view(obj: Mapping[str, Any]) -> PolicyView:
    metadata = obj.get("metadata") or {}
    view = PolicyView(
        name=str(metadata.get("name")),
        spec=None,
        status=PolicyStatus.model_validate(obj.get("status") or {}),
        annotations=dict(metadata.get("annotations") or {}),
        generation=metadata.get("generation"),
    )
    try:
        view.spec = policy_validation.validate_spec(obj.get("spec") or {})
    except PolicyInvalid as invalid:
        view.invalid = invalid.message
    return view


async def read_kube(kube: client.Kube, policy_name: str | None = None) -> Snapshot:
    """The policy and the GPU nodes, as the API server has them."""
    policy = policy_view(await find_policy(kube, policy_name))
    listed = await kube.call(kube.core.list_node, label_selector=GPU_NODES)
    selector = policy.spec.upgrade_policy.node_selector if policy.spec else ""
    found = {}
    for node in listed.get("items") or []:
        labels = nodes.labels_of(node)
        name = str(node["metadata"]["name"])
        found[name] = NodeView(
            name=name,
            state=_state(labels.get(STATE_LABEL)),
            driver=labels.get(DRIVER_LABEL),
            kernel=_kernel(node),
            ready=_is_ready(node),
            unschedulable=nodes.is_unschedulable(node),
            selected=selectors.matches(selector, labels),
            skip=admission.skipped_by(labels),
            labels=dict(labels),
        )
    return Snapshot(policy=policy, nodes=dict(sorted(found.items())), sources=("kubernetes",))


async def read_events(bus: Bus) -> Snapshot:
    """The nodes, policy and latest rollout as the stored events tell them."""
    snapshot = Snapshot(sources=("events",))
    async for stored in bus.read(f"{bus.prefix}.evt.upgrade.>", follow=False):
        try:
            envelope, payload = decode_on(stored.subject, stored.data)
        except (MalformedMessage, UnknownEventType):
            continue
        if isinstance(payload, up.NodeUpgradeStateChanged):
            view = snapshot.nodes.setdefault(envelope.node, NodeView(envelope.node))
            view.state, view.attempt = payload.to_state, payload.attempt
            view.reason, view.rollout = payload.reason, payload.rollout_id
            key = f"{payload.rollout_id}/{envelope.node}/{payload.attempt}"
            snapshot.changes.append(StateChange(key, payload.to_state, envelope.time))
        elif isinstance(payload, up.PolicyApplied):
            snapshot.policy = _applied(payload)
        elif isinstance(payload, up.RolloutEvent):
            snapshot.rollout = _rollout(snapshot.rollout, payload)
    inventories = subjects.events_filter(
        HardwareDiscovered.DOMAIN, name=HardwareDiscovered.NAME, prefix=bus.prefix
    )
    async for stored in bus.read(inventories, follow=False):
        try:
            envelope, payload = decode_on(stored.subject, stored.data)
        except (MalformedMessage, UnknownEventType):
            continue
        if isinstance(payload, HardwareDiscovered):
            view = snapshot.nodes.setdefault(envelope.node, NodeView(envelope.node))
            view.driver, view.ofed = payload.driver_version, payload.ofed_version
            view.kernel = payload.kernel_release
            view.inventory = payload
    snapshot.nodes = dict(sorted(snapshot.nodes.items()))
    return snapshot


def merge(kube: Snapshot, log: Snapshot) -> Snapshot:
    """Kubernetes' policy and nodes, with the attempt, reason and versions only the log
    has, and the log's rollout and state changes."""
    merged = {}
    for name, view in kube.nodes.items():
        logged = log.nodes.get(name)
        if logged is not None:
            view = replace(
                view,
                attempt=logged.attempt if logged.state == view.state else None,
                reason=logged.reason if logged.state == view.state else "",
                rollout=logged.rollout,
                driver=view.driver or logged.driver,
                ofed=logged.ofed,
                kernel=view.kernel or logged.kernel,
                inventory=logged.inventory,
            )
        merged[name] = view
    return Snapshot(
        policy=kube.policy,
        nodes=merged,
        rollout=log.rollout,
        changes=log.changes,
        sources=(*kube.sources, *log.sources),
    )


def running_versions(view: NodeView) -> dict[Component, str | None]:
    return {Component.GPU: view.driver, Component.OFED: view.ofed}


def _state(value: str | None) -> up.UpgradeState | None:
    try:
        return up.UpgradeState(value) if value else None
    except ValueError:
        return None


def _kernel(node: Mapping[str, Any]) -> str | None:
    info = (node.get("status") or {}).get("nodeInfo") or {}
    release = info.get("kernelVersion")
    return str(release) if release else None


def _is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _applied(applied: up.PolicyApplied) -> PolicyView:
    view = PolicyView(name="(as last applied)", spec=None)
    try:
        view.spec = policy_validation.validate_spec(applied.spec)
    except PolicyInvalid as invalid:
        view.invalid = invalid.message
    return view


def _rollout(current: RolloutView | None, event: up.RolloutEvent) -> RolloutView:
    if isinstance(event, up.RolloutStarted):
        targets = {str(c): v for c, v in event.target_versions.items()}
        return RolloutView(event.rollout_id, targets, total=event.total)
    if current is None or current.rollout_id != event.rollout_id:
        if isinstance(event, up.RolloutFailed) and current is not None:
            return current  # an earlier rollout told superseded: the current one goes on
        current = RolloutView(event.rollout_id)
    if isinstance(event, up.RolloutCounts):
        current.done, current.failed, current.total = event.done, event.failed, event.total
    if isinstance(event, up.RolloutProgress):
        current.skipped = event.skipped
    if isinstance(event, up.RolloutCompleted):
        current.ended = "completed"
    elif isinstance(event, up.RolloutFailed):
        current.ended = f"failed: {event.reason}"
    return current
