"""GPU health as a cluster admin sees it: the Node condition `GPUHealthy` and the taint
`gpuop.io/gpu-unhealthy`.

The remediation (the orchestrator's cluster role) mirrors telemetry's health events into
these; this module is the Kubernetes side only, the same against a real API server as
against `gpuop_sim`. Events about the same changes go through `recording.EventRecorder`.

`set_node_condition` writes one condition through the Node's `status` subresource as a
strategic merge patch: `NodeStatus.conditions` merges by `type`, so the kubelet's own
conditions (Ready, MemoryPressure, ...) stay as they are. `lastHeartbeatTime` is set on
every call; `lastTransitionTime` changes only when the status does, so the condition is
read first and the patch carries the read `resourceVersion` as a precondition: on 409 it
is read and decided again (a kubelet heartbeat in between must not make a transition time
out of a stale read).

`add_taint` and `remove_taint` change `spec.taints`, which the API treats as an atomic list
(no merge key: any patch replaces it whole), so each reads the node, changes the list and
writes all of it back with the read `resourceVersion`, retrying on 409
(`nodes.update_on_fresh_read`): a taint someone else adds meanwhile is never dropped. Both
are idempotent. A taint list that is not a list of taints (no real server stores one, a
seeded or hand-built object may carry one) is refused with `errors.Invalid` naming the node
and the entry, rather than written back.

`record_gpu_health` writes the Kubernetes Event that goes with a change of the condition
(`recording.EventRecorder`: Warning with the condition's reason and message when a GPU
fails, Normal when all are healthy again), so `kubectl describe node` shows both.

`gpu_healthy_condition` is pure: the condition's status, reason and message for the GPUs
that are unhealthy now, in the same order every time (a replay writes the same message).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuop.kube import errors, nodes
from gpuop.kube.client import Kube
from gpuop.kube.recording import EventRecorder, EventType

Obj = dict[str, Any]

GPU_HEALTHY_CONDITION = "GPUHealthy"
"""The Node condition type: True while every GPU of the node is healthy."""
GPU_UNHEALTHY_TAINT = "gpuop.io/gpu-unhealthy"
"""The taint key (effect NoSchedule) a quarantined node carries."""
HEALTHY_REASON = "GPUsHealthy"
UNHEALTHY_REASON = "GPUUnhealthy"
MAX_MESSAGE = 1024
"""The longest condition message written; GPUs beyond it are counted, not named."""
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

log = logging.getLogger(__name__)


def gpu_healthy_condition(unhealthy: Mapping[str, tuple[int, ...]]) -> tuple[bool, str, str]:
    """`(status, reason, message)` of `GPUHealthy` for the GPUs unhealthy now (GPU UUID ->
    the XIDs seen on it, empty for an ECC error or a GPU that does not answer)."""
    if not unhealthy:
        return True, HEALTHY_REASON, "all GPUs are healthy"
    named = [_describe(uuid, unhealthy[uuid]) for uuid in sorted(unhealthy)]
    head = f"{len(named)} GPU{'s' if len(named) > 1 else ''} unhealthy: "
    message = head + "; ".join(named)
    if len(message) > MAX_MESSAGE:
        message = _cut(head, named)
    return False, UNHEALTHY_REASON, message


def _describe(uuid: str, xids: tuple[int, ...]) -> str:
    seen = list(dict.fromkeys(xids))
    if not seen:
        return f"{uuid} (no XID)"
    return f"{uuid} (XID {', '.join(str(xid) for xid in seen)})"


def _cut(head: str, named: list[str]) -> str:
    """As many GPUs as fit in `MAX_MESSAGE`, then how many more there are."""
    for kept in range(len(named) - 1, -1, -1):
        message = f"{head}{'; '.join(named[:kept])}; and {len(named) - kept} more"
        if len(message) <= MAX_MESSAGE:
            return message
    return head[:MAX_MESSAGE]


async def record_gpu_health(
    recorder: EventRecorder, node: str, status: bool, reason: str, message: str
) -> Obj:
    """Record the Event of a `GPUHealthy` change (the arguments as `set_node_condition`'s)
    and return it as written. An Event is a record: a caller that must not fail for one
    catches `KubeError`."""
    kind = EventType.NORMAL if status else EventType.WARNING
    return await recorder.node_event(node, reason, message, event_type=kind)


def condition_of(node: Mapping[str, Any], type_: str) -> Obj | None:
    """The node's condition of `type_`, as the server returned it."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == type_:
            return condition
    return None


async def set_node_condition(
    kube: Kube, node: str, type_: str, status: bool, reason: str, message: str
) -> None:
    """Set the Node condition `type_` (see the module docstring); `NotFound` names the node
    when it does not exist."""
    attempt = 1
    while True:
        current = await _read(kube, node, f"set condition {type_}")
        body = _condition_patch(current, type_, status, reason, message, _timestamp(kube))
        try:
            await kube.call(
                kube.core.patch_node_status,
                node,
                body,
                _content_type=nodes.STRATEGIC_MERGE_PATCH,
            )
            return
        except errors.NotFound as error:
            raise _missing(node, f"set condition {type_}", error) from error
        except errors.Conflict:
            if attempt >= nodes.CONFLICT_ATTEMPTS:
                raise
            attempt += 1
            log.info("node %s changed while its %s condition was set; again", node, type_)


def _condition_patch(
    current: Obj, type_: str, status: bool, reason: str, message: str, now: str
) -> Obj:
    wanted = "True" if status else "False"
    previous = condition_of(current, type_)
    transition = now
    if previous is not None and previous.get("status") == wanted:
        transition = previous.get("lastTransitionTime") or now
    condition = {
        "type": type_,
        "status": wanted,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition,
    }
    return {
        "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
        "status": {"conditions": [condition]},
    }


async def add_taint(kube: Kube, node: str, key: str, value: str, effect: str) -> None:
    """Put the taint `key=value:effect` on the node, keeping every other taint; a taint of
    the same key and effect with another value gets this value. Nothing is written when
    the taint is there already."""
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    stamp = _timestamp(kube)

    def decide(current: Obj) -> Obj | None:
        taints = _taints(current, node)
        same = [t for t in taints if t.get("key") == key and t.get("effect") == effect]
        if same and all(t.get("value", "") == value for t in same):
            return None
        wanted: Obj = {"key": key, "effect": effect}
        if value:
            wanted["value"] = value
        if effect == "NoExecute":
            wanted["timeAdded"] = stamp  # the taint manager counts tolerationSeconds from it
        kept = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
        return {"spec": {"taints": [*kept, wanted]}}

    await _update(kube, node, decide, f"add taint {key}:{effect}")


async def remove_taint(kube: Kube, node: str, key: str) -> None:
    """Remove every taint of `key` (whatever its effect) from the node, keeping the others.
    Nothing is written when the node has none."""

    def decide(current: Obj) -> Obj | None:
        taints = _taints(current, node)
        kept = [t for t in taints if t.get("key") != key]
        if len(kept) == len(taints):
            return None
        return {"spec": {"taints": kept or None}}

    await _update(kube, node, decide, f"remove taint {key}")


def _taints(node: Mapping[str, Any], name: str) -> list[Obj]:
    """The node's taints, refusing a list that holds anything but taints."""
    taints = (node.get("spec") or {}).get("taints")
    if taints is None:
        return []
    if not isinstance(taints, list):
        raise _malformed(name, f"spec.taints is a {type(taints).__name__}, not a list")
    for index, taint in enumerate(taints):
        if not isinstance(taint, dict):
            raise _malformed(name, f"spec.taints[{index}] is not a taint: {taint!r}"[:512])
        if not isinstance(taint.get("key"), str) or not taint["key"]:
            raise _malformed(name, f"spec.taints[{index}] has no key: {taint!r}"[:512])
        if taint.get("effect") not in TAINT_EFFECTS:
            raise _malformed(name, f"spec.taints[{index}] has effect {taint.get('effect')!r}"[:512])
    return [dict(taint) for taint in taints]


def _malformed(node: str, what: str) -> errors.Invalid:
    return errors.Invalid(
        f"node {node} has a malformed taint list, left as it is: {what}", reason="Invalid"
    )


async def _update(kube: Kube, node: str, decide: Callable[[Obj], Obj | None], doing: str) -> None:
    try:
        await nodes.update_on_fresh_read(kube, node, decide)
    except errors.NotFound as error:
        raise _missing(node, doing, error) from error


async def _read(kube: Kube, node: str, doing: str) -> Obj:
    try:
        return await nodes.get(kube, node)
    except errors.NotFound as error:
        raise _missing(node, doing, error) from error


def _missing(node: str, doing: str, error: errors.NotFound) -> errors.NotFound:
    return errors.NotFound(
        f"cannot {doing} on node {node}: the node does not exist ({error.message})",
        code=error.code,
        reason=error.reason,
        status=error.status,
    )


def _timestamp(kube: Kube) -> str:
    return kube.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
