"""Drain a node the way `kubectl drain` does, with a deadline on every wait.

Called by the upgrade orchestrator in `drain-required` (every pod but the skipped ones) and
in `pod-deletion-required` (only the pods holding the upgraded components' devices:
`DrainOptions(pod_filter_from=...)` with `pods.holders_filter`, which reads the pods'
ResourceClaims first).

1. List the node's pods, narrowed by `pod_selector`, with a list-watch (`pods.watch_on_node`)
   that later follows them: a drain costs one LIST and one WATCH whatever it waits for. A
   caller that follows the node's pods already passes its `informers.Informer` instead (of
   every pod on the node: narrow with `pod_filter`), and the drain costs neither.
2. Sort them (`plan`, a pure function). Skipped: pods labelled with a drain skip label
   (`nvidia.com/<drv>-driver-upgrade-drain.skip=true`), pods `pod_filter` rejects (and
   the filter `pod_filter_from` builds from the listed pods, for one that must read
   something first),
   unfinished DaemonSet pods, and mirror pods (`kubernetes.io/config.mirror`; the kubelet
   owns them). Refused: unfinished pods with emptyDir volumes unless `delete_emptydir`,
   and unfinished pods without a controller unless `force`. Any refusal raises
   `DrainRefused` before anything is evicted.
3. Evict the rest, all at once, through the policy/v1 Eviction subresource (or delete them
   when `use_eviction` is off), each bound to the pod's uid so that a successor with the
   same name is never touched. A 429 (a PodDisruptionBudget allows no disruption now) is
   retried every `retry_interval` until the deadline, then `DrainTimedOut` names the
   budget. A pod already gone counts as removed. At a pod's first 429, a budget that
   already counts an eviction of that very pod (`budgets.counted`: a drain before this one
   died between the count and the delete, as a leader SIGKILLed mid-eviction does) gets
   the pod deleted rather than evicted again: the disruption is paid for once, and the drain
   does not wait two minutes for the disruption controller to forget it.
4. Wait, on that watch, until every removed pod is gone from the node (deleted, or its name
   taken by a new uid); at the deadline, `DrainTimedOut` names the pods still there.

One deadline, `timeout` seconds after the start, bounds steps 3 and 4 together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import budgets, errors, pods
from gpuop.kube.client import Kube
from gpuop.kube.informers import Informer
from gpuop.kube.pods import PodRef

Obj = dict[str, Any]

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
LOCAL_STORAGE = "pods with local storage (emptyDir) need delete_emptydir"
UNMANAGED = "pods that declare no controller need force"

log = logging.getLogger(__name__)


def skip_label(driver: str) -> str:
    """The pod label that keeps a pod out of `driver`'s drains (`gpu`, `ofed`)."""
    return f"nvidia.com/{driver}-driver-upgrade-drain.skip"


DEFAULT_SKIP_LABELS = (skip_label("gpu"), skip_label("ofed"))
"""Both drivers' labels: a node's GPU and NIC driver upgrades share one cordon and drain."""


@dataclass(frozen=True)
class DrainOptions:
    """What a drain may remove, and how long it may take."""

    force: bool = False
    """Also remove pods that no controller will recreate."""
    delete_emptydir: bool = False
    """Also remove pods with emptyDir volumes, whose data is lost."""
    timeout: float = 300.0
    """Seconds from the start until the drain gives up with `DrainTimedOut`."""
    pod_selector: str | None = None
    """A label selector: only matching pods are considered at all."""
    pod_filter: Callable[[Mapping[str, Any]], bool] | None = None
    """Only pods it accepts are removed; the others are skipped as `FILTERED`."""
    pod_filter_from: (
        Callable[[Sequence[Mapping[str, Any]]], Awaitable[Callable[[Mapping[str, Any]], bool]]]
        | None
    ) = None
    """Builds a further filter from the node's pods once they are listed (one that must
    read other objects first, such as the ResourceClaims the pods use); only pods both
    filters accept are removed."""
    skip_labels: tuple[str, ...] = DEFAULT_SKIP_LABELS
    """Pods carrying any of these labels with the value "true" are skipped."""
    grace_period_seconds: int | None = None
    """Overrides each pod's own termination grace period."""
    use_eviction: bool = True
    """Evict (honouring PodDisruptionBudgets); False deletes directly."""
    retry_interval: float = 5.0
    """Seconds between attempts at an eviction a budget refused."""

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError("a drain needs a positive timeout: every wait has a deadline")


class SkipReason(StrEnum):
    SKIP_LABEL = "skip-label"
    """The pod carries a drain skip label."""
    FILTERED = "filtered"
    """`pod_filter` did not accept the pod."""
    DAEMONSET = "daemonset"
    """A DaemonSet pod: its controller would put it right back."""
    MIRROR = "mirror"
    """A static pod's mirror: only the kubelet can remove it."""


@dataclass(frozen=True)
class SkippedPod:
    pod: PodRef
    reason: SkipReason


@dataclass(frozen=True)
class DrainPlan:
    remove: tuple[Obj, ...]
    skipped: tuple[SkippedPod, ...]
    refused: tuple[tuple[PodRef, str], ...]
    """Pods the options do not allow to remove, each with the rule that stops it."""


@dataclass(frozen=True)
class DrainResult:
    node: str
    evicted: tuple[PodRef, ...]
    """Pods removed by this drain (evicted, deleted, or found already gone)."""
    skipped: tuple[SkippedPod, ...]


def _skip_reason(pod: Mapping[str, Any], options: DrainOptions) -> SkipReason | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if any(labels.get(label) == "true" for label in options.skip_labels):
        return SkipReason.SKIP_LABEL
    if options.pod_filter is not None and not options.pod_filter(pod):
        return SkipReason.FILTERED
    controller = pods.controller_of(pod)
    is_daemon = controller is not None and controller.get("kind") == "DaemonSet"
    if is_daemon and not pods.is_finished(pod):
        return SkipReason.DAEMONSET
    if MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {}):
        return SkipReason.MIRROR
    return None


def _refusal(pod: Mapping[str, Any], options: DrainOptions) -> str | None:
    if pods.is_finished(pod):
        return None  # nothing runs any more, so nothing is lost
    volumes = (pod.get("spec") or {}).get("volumes") or []
    if not options.delete_emptydir and any("emptyDir" in volume for volume in volumes):
        return LOCAL_STORAGE
    if not options.force and pods.controller_of(pod) is None:
        return UNMANAGED
    return None


def plan(node_pods: Iterable[Obj], options: DrainOptions) -> DrainPlan:
    """Sort a node's pods into those to remove, to skip, and those that block the drain."""
    remove: list[Obj] = []
    skipped: list[SkippedPod] = []
    refused: list[tuple[PodRef, str]] = []
    for pod in node_pods:
        if (reason := _skip_reason(pod, options)) is not None:
            skipped.append(SkippedPod(PodRef.of(pod), reason))
        elif (refusal := _refusal(pod, options)) is not None:
            refused.append((PodRef.of(pod), refusal))
        else:
            remove.append(pod)
    return DrainPlan(tuple(remove), tuple(skipped), tuple(refused))


def _refused_error(node: str, refused: tuple[tuple[PodRef, str], ...]) -> errors.DrainRefused:
    rules: dict[str, list[str]] = {}
    for ref, rule in refused:
        rules.setdefault(rule, []).append(str(ref))
    reason = "; ".join(f"{rule}: {', '.join(names)}" for rule, names in rules.items())
    return errors.DrainRefused(node=node, pods=[str(ref) for ref, _ in refused], reason=reason)


@dataclass(frozen=True)
class _Removal:
    pod: PodRef
    timed_out: bool = False
    pdb: str | None = None


async def _remove_once(kube: Kube, ref: PodRef, options: DrainOptions) -> None:
    if not options.use_eviction:
        await pods.delete(kube, ref, grace_period_seconds=options.grace_period_seconds)
        return
    delete_options: Obj = {"preconditions": {"uid": ref.uid}}
    if options.grace_period_seconds is not None:
        delete_options["gracePeriodSeconds"] = options.grace_period_seconds
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": ref.name, "namespace": ref.namespace},
        "deleteOptions": delete_options,
    }
    await kube.call(kube.core.create_namespaced_pod_eviction, ref.name, ref.namespace, eviction)


async def _remove(
    kube: Kube, pod: Obj, options: DrainOptions, deadline: float, clock: Clock
) -> _Removal:
    """Evict one pod, retrying while a budget refuses, until the deadline."""
    ref = PodRef.of(pod)
    pdb: str | None = None
    refusals = 0
    while True:
        try:
            await _remove_once(kube, ref, options)
            return _Removal(ref)
        except (errors.NotFound, errors.Conflict):
            return _Removal(ref)  # gone already, or replaced by a pod with another uid
        except errors.TooManyRequests as refused:
            pdb = await budgets.blocking(kube, pod, refused)
            refusals += 1
        # Only the first refusal looks: a count this drain did not make was made before it
        # started (its evictions are counted and deleted in one request), and a read per
        # retry would double a blocked drain's requests.
        if refusals == 1 and options.use_eviction and pdb and await budgets.counted(kube, pdb, pod):
            log.info("%s: budget %s counts its eviction already; deleting it", ref, pdb)
            await pods.delete(kube, ref, grace_period_seconds=options.grace_period_seconds)
            return _Removal(ref)
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            return _Removal(ref, timed_out=True, pdb=pdb)
        log.info("eviction of %s refused by budget %s; retrying", ref, pdb or "(unknown)")
        await clock.sleep(min(options.retry_interval, remaining))


async def _remove_all(
    kube: Kube, to_remove: tuple[Obj, ...], options: DrainOptions, deadline: float, clock: Clock
) -> list[_Removal]:
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(_remove(kube, pod, options, deadline, clock)) for pod in to_remove
            ]
    except BaseExceptionGroup as failed:
        # The first failure cancelled the other evictions; it is the one to report.
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


async def _next_change(changes: Informer, since: int, seconds: float, clock: Clock) -> None:
    """Return after a change later than `since`, or after `seconds` on `clock`."""
    change = asyncio.ensure_future(changes.changed(since))
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait([change, timer], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in (change, timer):
            waiter.cancel()
        await asyncio.gather(timer, return_exceptions=True)
        # a change is in `changes.objects` already; a failure of the watch is not
        outcome = await asyncio.gather(change, return_exceptions=True)
    if isinstance(outcome[0], Exception):
        raise outcome[0]


async def _wait_gone(
    changes: Informer, removed: Iterable[PodRef], deadline: float, clock: Clock
) -> list[PodRef]:
    """Follow the node's pods until none of `removed` is left; returns those left at the
    deadline."""
    waiting = set(removed)
    while True:
        since = changes.version
        waiting &= {PodRef.of(pod) for pod in changes.objects.values()}
        remaining = deadline - clock.monotonic()
        if not waiting or remaining <= 0:
            return sorted(waiting)
        await _next_change(changes, since, remaining, clock)


async def _with_built_filter(options: DrainOptions, listed: Sequence[Obj]) -> DrainOptions:
    """`options` with the filter `pod_filter_from` builds from the listed pods folded into
    `pod_filter`."""
    if options.pod_filter_from is None:
        return options
    built = await options.pod_filter_from(listed)
    given = options.pod_filter
    if given is None:
        return replace(options, pod_filter=built, pod_filter_from=None)

    def both(pod: Mapping[str, Any]) -> bool:
        return given(pod) and built(pod)

    return replace(options, pod_filter=both, pod_filter_from=None)


async def drain_node(
    kube: Kube,
    node: str,
    options: DrainOptions | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    node_pods: Informer | None = None,
) -> DrainResult:
    """Remove the pods of `node` that the options allow; see the module docstring. The node
    should be cordoned first, or its controllers may schedule replacements onto it.
    `node_pods`: an informer of every pod on the node, which the drain reads and leaves
    open; `options.pod_selector` must then be None."""
    options = options or DrainOptions()
    if node_pods is not None and options.pod_selector:
        raise ValueError("a shared informer has every pod: narrow it with pod_filter")
    deadline = clock.monotonic() + options.timeout
    async with contextlib.AsyncExitStack() as owned:
        watch = node_pods
        if watch is None:
            listing = pods.watch_on_node(
                kube, node, label_selector=options.pod_selector, clock=clock
            )
            watch = await owned.enter_async_context(Informer(listing))
        listed = sorted((await watch.synced()).values(), key=PodRef.of)
        options = await _with_built_filter(options, listed)
        drain = plan(listed, options)
        if drain.refused:
            raise _refused_error(node, drain.refused)
        removals = await _remove_all(kube, drain.remove, options, deadline, clock)
        blocked = [removal for removal in removals if removal.timed_out]
        if blocked:
            raise errors.DrainTimedOut(
                node=node,
                pods=[str(removal.pod) for removal in blocked],
                timeout=options.timeout,
                pdbs=sorted({removal.pdb for removal in blocked if removal.pdb}),
            )
        removed = [removal.pod for removal in removals]
        left = await _wait_gone(watch, removed, deadline, clock)
    if left:
        raise errors.DrainTimedOut(
            node=node, pods=[str(ref) for ref in left], timeout=options.timeout
        )
    return DrainResult(node, tuple(removed), drain.skipped)
