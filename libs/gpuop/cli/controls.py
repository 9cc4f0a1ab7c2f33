"""The rollout controls of `gpuop upgrade`: each is one JSON merge patch of the
GPUClusterPolicy, so every orchestrator replica and `gpuop replay` see it (the orchestrator
records the policy it decides with as `PolicyApplied`).

    start   spec.driver.<component>.version (and source), upgradePolicy.maxParallelUpgrades
            and nodeSelector when given; clears upgradePolicy.paused; remembers the versions
            it replaced in the annotation `LAST_START`
    pause   upgradePolicy.paused = true: nothing new is admitted, nodes under way finish
    resume  upgradePolicy.paused = false
    abort   undoes the last `start`: the versions it replaced come back (nodes it upgraded
            are rolled back to them, the others are left alone), paused is cleared, and the
            annotation removed, so a second abort has nothing to undo

With a driver pool (`--pool`), each acts on that pool's entry of `spec.driver.pools`
instead: its own version of the component, its `upgradePolicy.maxParallelUpgrades` and
`paused`; the other pools and the defaults are left as they are. A merge patch replaces a
list whole, so the patch carries every pool, and the resourceVersion guard below keeps an
edit of another pool made meanwhile.

The builders are pure (`start`, `pause`, `abort`); `apply` sends a patch with the
resourceVersion it was computed from, so an edit made meanwhile by someone else is never
overwritten: the patch is recomputed on a fresh read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuop.cli.errors import CommandFailed
from gpuop.cli.snapshots import RESOURCE, PolicyView, find_policy, policy_view
from gpuop.events.driver import Component
from gpuop.kube import client, customobjects, errors
from gpuop.policy import GPUClusterPolicySpec, PolicyInvalid, validate_spec

LAST_START = "gpuop.io/last-upgrade-start"
"""Annotation `start` writes: {"from": {component: spec or null}, "to": {...}}."""
ATTEMPTS = 5
"""Fresh reads before giving up on a policy that keeps changing under us."""

Obj = dict[str, Any]


@dataclass(frozen=True)
class Edit:
    """A change of the policy, and what it means in words."""

    action: str
    patch: Obj
    """The merge patch; empty: nothing to change."""
    summary: str
    """One line for people."""


def components(spec: GPUClusterPolicySpec, pool: str | None = None) -> dict[str, Obj | None]:
    """Each component's `{version, source}` as the spec has it (None: not managed, or in a
    pool: the default's)."""
    found: dict[str, Obj | None] = {}
    owner: Any = spec.driver if pool is None else spec.driver.pool(pool)
    for component in Component:
        wanted = getattr(owner, str(component))
        found[str(component)] = (
            None
            if wanted is None
            else wanted.model_dump(mode="json", by_alias=True, exclude_none=True)
        )
    return found


def versions(spec: GPUClusterPolicySpec) -> str:
    """`gpu 580.1, ofed 25.04` for messages."""
    wanted = components(spec)
    return ", ".join(f"{c} {w['version']}" for c, w in wanted.items() if w)


def start(
    policy: PolicyView,
    component: Component,
    version: str,
    *,
    source: str | None = None,
    max_parallel: int | None = None,
    selector: str | None = None,
    pool: str | None = None,
) -> Edit:
    spec = _valid(policy)
    if pool is not None:
        return _start_pool(policy, spec, pool, component, version, source, max_parallel, selector)
    upgrade: Obj = {"paused": False}
    if max_parallel is not None:
        upgrade["maxParallelUpgrades"] = max_parallel
    if selector is not None:
        upgrade["nodeSelector"] = selector
    wanted: Obj = {"version": version}
    if source is not None:
        wanted["source"] = source
    patch: Obj = {"spec": {"driver": {str(component): wanted}, "upgradePolicy": upgrade}}
    before = components(spec)
    after = components(_merged(policy, spec, patch))
    current = before[str(component)]
    was = current["version"] if current else "(not managed)"
    if before != after:
        last = _last_start(policy)
        if (
            last is not None
            and last["to"] == before
            and _versions_of(before) == _versions_of(after)
        ):
            before = last["from"]  # the same start amended (another source): undo them both
        remembered = json.dumps({"from": before, "to": after}, sort_keys=True)
        patch["metadata"] = {"annotations": {LAST_START: remembered}}
        summary = f"{component} driver {was} -> {version}"
    else:
        summary = f"{component} driver {version} already asked for"
    return Edit("start", _unless_unchanged(policy, spec, patch), summary)


def _start_pool(
    policy: PolicyView,
    spec: GPUClusterPolicySpec,
    pool: str,
    component: Component,
    version: str,
    source: str | None,
    max_parallel: int | None,
    selector: str | None,
) -> Edit:
    """`start` for one driver pool: its own version of `component`, its parallelism, and
    its pause cleared."""
    if selector is not None:
        raise ValueError(
            "--selector with --pool: a pool's nodes are its nodeSelector; edit it in the policy"
        )
    _pool_named(policy, spec, pool)

    def change(entry: Obj) -> Obj:
        # The patch replaces the pools list whole: keep what the pool's entry has beside the
        # version (its source, keys, kernelModuleType), as the merge patch of the defaults does.
        wanted: Obj = {**(entry.get(str(component)) or {}), "version": version}
        if source is not None:
            wanted["source"] = source
        upgrade = {**entry.get("upgradePolicy", {}), "paused": False}
        if max_parallel is not None:
            upgrade["maxParallelUpgrades"] = max_parallel
        return {**entry, str(component): wanted, "upgradePolicy": upgrade}

    patch: Obj = {"spec": {"driver": {"pools": _pools_with(spec, pool, change)}}}
    before = components(spec, pool)
    after = components(_merged(policy, spec, patch), pool)
    current = before[str(component)]
    was = current["version"] if current else "(the default's)"
    if before != after:
        remembered = json.dumps({"from": before, "to": after, "pool": pool}, sort_keys=True)
        patch["metadata"] = {"annotations": {LAST_START: remembered}}
        summary = f"pool {pool}: {component} driver {was} -> {version}"
    else:
        summary = f"pool {pool}: {component} driver {version} already asked for"
    return Edit("start", _unless_unchanged(policy, spec, patch), summary)


def _pool_named(policy: PolicyView, spec: GPUClusterPolicySpec, pool: str) -> None:
    names = [p.name for p in spec.driver.pools]
    if pool not in names:
        having = ", ".join(names) if names else "none"
        raise ValueError(
            f"--pool {pool}: GPUClusterPolicy {policy.name} has no such driver pool "
            f"(its pools: {having})"
        )


def _pools_with(spec: GPUClusterPolicySpec, pool: str, change: Callable[[Obj], Obj]) -> list[Obj]:
    """Every pool as the policy has it on the wire, `pool`'s changed by `change`."""
    wire = spec.to_wire()["driver"].get("pools", [])
    return [change(entry) if entry["name"] == pool else entry for entry in wire]


def pause(policy: PolicyView, paused: bool, pool: str | None = None) -> Edit:
    spec = _valid(policy)
    action = "pause" if paused else "resume"
    if pool is not None:
        _pool_named(policy, spec, pool)
        if _pool_paused(spec, pool) == paused:
            return Edit(action, {}, f"pool {pool} already {'paused' if paused else 'running'}")

        def change(entry: Obj) -> Obj:
            return {**entry, "upgradePolicy": {**entry.get("upgradePolicy", {}), "paused": paused}}

        pooled: Obj = {"spec": {"driver": {"pools": _pools_with(spec, pool, change)}}}
        if paused:
            summary = f"pool {pool} paused: none of its nodes is admitted; the other pools go on"
        else:
            summary = f"pool {pool} resumed: its nodes are admitted again"
        return Edit(action, pooled, summary)
    if spec.upgrade_policy.paused == paused:
        return Edit(action, {}, f"already {'paused' if paused else 'running'}")
    patch = {"spec": {"upgradePolicy": {"paused": paused}}}
    if paused:
        summary = "paused: no node is admitted until `gpuop upgrade resume`; nodes under way finish"
    else:
        summary = "resumed: nodes are admitted again"
    return Edit(action, patch, summary)


def _pool_paused(spec: GPUClusterPolicySpec, pool: str) -> bool:
    found = spec.driver.pool(pool)
    return found is not None and found.upgrade_policy.paused


def abort(policy: PolicyView, pool: str | None = None) -> Edit:
    spec = _valid(policy)
    last = _last_start(policy)
    started_in = last.get("pool") if last is not None else None
    if pool is not None and last is not None and started_in != pool:
        where = f"pool {started_in}" if started_in else "the default drivers"
        raise CommandFailed(f"nothing to abort in pool {pool}: the last start was for {where}")
    if started_in is not None:
        assert last is not None
        return _abort_pool(policy, spec, started_in, last)
    if last is None or last["to"] != components(spec):
        raise CommandFailed(
            f"nothing to abort: GPUClusterPolicy {policy.name} asks for {versions(spec)}, not "
            "set by `gpuop upgrade start` (or aborted already); to go to another version, run "
            "`gpuop upgrade start --version V`"
        )
    restored: Obj = {}
    for component, wanted in last["from"].items():
        if wanted is None:
            restored[component] = None
        else:
            restored[component] = {"version": wanted["version"], "source": wanted.get("source")}
    patch: Obj = {
        "metadata": {"annotations": {LAST_START: None}},
        "spec": {"driver": restored, "upgradePolicy": {"paused": False}},
    }
    back = versions(_merged(policy, spec, patch))
    return Edit("abort", patch, f"back to {back}: upgraded nodes are rolled back, others left")


def _abort_pool(
    policy: PolicyView, spec: GPUClusterPolicySpec, pool: str, last: dict[str, Any]
) -> Edit:
    try:
        now = components(spec, pool)
    except KeyError:
        now = None
    if now is None or last["to"] != now:
        raise CommandFailed(
            f"nothing to abort: pool {pool} of GPUClusterPolicy {policy.name} was changed "
            "since the last `gpuop upgrade start --pool` (or aborted already)"
        )

    def change(entry: Obj) -> Obj:
        restored = {k: v for k, v in entry.items() if k not in {str(c) for c in Component}}
        for component, wanted in last["from"].items():
            if wanted is not None:
                restored[component] = wanted
        upgrade = {**entry.get("upgradePolicy", {}), "paused": False}
        return {**restored, "upgradePolicy": upgrade}

    patch: Obj = {
        "metadata": {"annotations": {LAST_START: None}},
        "spec": {"driver": {"pools": _pools_with(spec, pool, change)}},
    }
    merged = _merged(policy, spec, patch)
    back = ", ".join(
        f"{c} {t.version}"
        for c, t in zip(("gpu", "ofed"), merged.driver.components_of(pool), strict=True)
        if t is not None
    )
    return Edit("abort", patch, f"pool {pool} back to {back}: its upgraded nodes are rolled back")


async def apply(
    kube: client.Kube, name: str | None, build: Callable[[PolicyView], Edit]
) -> tuple[PolicyView, Edit]:
    """Read the policy, build the edit, patch it on that resourceVersion; on a conflict,
    read again. Returns the policy as patched (or as read, when nothing changed)."""
    for _ in range(ATTEMPTS):
        obj = await find_policy(kube, name)
        policy = policy_view(obj)
        edit = build(policy)
        if not edit.patch:
            return policy, edit
        patch = _with_version(edit.patch, obj["metadata"]["resourceVersion"])
        try:
            patched = await customobjects.patch(kube, RESOURCE, policy.name, patch)
        except errors.Conflict:
            continue
        except errors.Invalid as invalid:
            raise CommandFailed(f"the API server refused the change: {invalid}") from None
        return policy_view(patched), edit
    raise CommandFailed(f"GPUClusterPolicy {name or ''} kept changing; try again")


def _last_start(policy: PolicyView) -> dict[str, Any] | None:
    """The `LAST_START` annotation, when it is well-formed."""
    try:
        last = json.loads(policy.annotations.get(LAST_START) or "null")
    except json.JSONDecodeError:
        return None
    if not isinstance(last, dict) or not all(isinstance(last.get(k), dict) for k in ("from", "to")):
        return None
    return last


def _versions_of(wanted: Mapping[str, Any]) -> dict[str, str | None]:
    return {c: (w or {}).get("version") for c, w in wanted.items()}


def _valid(policy: PolicyView) -> GPUClusterPolicySpec:
    if policy.spec is None:
        raise CommandFailed(
            f"GPUClusterPolicy {policy.name} is invalid ({policy.invalid}); fix it first"
        )
    return policy.spec


def _merged(policy: PolicyView, spec: GPUClusterPolicySpec, patch: Obj) -> GPUClusterPolicySpec:
    """The spec after `patch`, checked as the orchestrator will check it."""
    try:
        return validate_spec(merge_patch(spec.to_wire(), patch["spec"]))
    except PolicyInvalid as invalid:
        raise ValueError(f"GPUClusterPolicy {policy.name} would be invalid: {invalid}") from None


def spec_after(policy: PolicyView, edit: Edit) -> GPUClusterPolicySpec:
    """The policy's spec once `edit` is applied, checked as the orchestrator will check it."""
    spec = _valid(policy)
    return _merged(policy, spec, edit.patch) if edit.patch.get("spec") else spec


def _unless_unchanged(policy: PolicyView, spec: GPUClusterPolicySpec, patch: Obj) -> Obj:
    changed = _merged(policy, spec, patch) != spec or "metadata" in patch
    return patch if changed else {}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, null removes a key, anything else replaces."""
    if not isinstance(patch, Mapping):
        return patch
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _with_version(patch: Obj, resource_version: str) -> Obj:
    metadata = {**patch.get("metadata", {}), "resourceVersion": resource_version}
    return {**patch, "metadata": metadata}
