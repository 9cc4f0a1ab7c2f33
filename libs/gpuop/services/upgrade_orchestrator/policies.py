"""The GPUClusterPolicy as the orchestrator sees it: watched, validated, status written.

`PolicyWatcher` list-watches the cluster's `GPUClusterPolicy` objects and follows one: the
first by name (a cluster has one; more are reported in the log). Each version of its spec
goes through `validate_spec`; an invalid one starts no rollout and admits no node (sagas
under way finish their current steps with the last valid spec) and sets the status
condition `Valid=False` whose message names the wrong field. `write_status` merges
conditions, per-state node counts, the count of skipped nodes and the current rollout
(`rollout`, which the controller names) into the status subresource, only when they
changed; a change of progress alone (the counts, the conditions' messages) at most every
`PROGRESS_INTERVAL` seconds, since the controller reconciles after every decision and would
otherwise write the status once per node and transition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events.upgrade import UpgradeState
from gpuop.kube import client, customobjects, errors
from gpuop.policy import Condition, GPUClusterPolicySpec, PolicyStatus, validation
from gpuop.policy.conditions import PoolProgress, RolloutRecord

log = logging.getLogger(__name__)

RESOURCE = customobjects.GPU_CLUSTER_POLICIES
PROGRESS_INTERVAL = 2.0
"""Seconds between status writes that only move the progress along; a later reconcile (at
least every `resync_seconds`) writes what was held back."""


def _outline(wire: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a written status says beyond progress: each condition's type, status, reason
    and generation, the rollout, the observed generation."""
    conditions = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
        for c in wire.get("conditions") or []
    ]
    return (wire.get("observedGeneration"), conditions, wire.get("rollout"))


class PolicyWatcher:
    """The followed policy's valid spec (or None) and its status."""

    def __init__(
        self,
        kube: client.Kube,
        *,
        on_change: Callable[[], None] = lambda: None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._kube = kube
        self._on_change = on_change
        self._clock = clock
        self._objects: dict[str, Mapping[str, Any]] = {}
        self.name: str | None = None
        """The followed policy's name."""
        self.generation: int | None = None
        self.spec: GPUClusterPolicySpec | None = None
        """The followed policy's spec when valid."""
        self.in_force: GPUClusterPolicySpec | None = None
        """The latest valid spec: sagas under way keep deciding with it while an invalid
        edit is being fixed, so their events are not retried into the dead-letter stream."""
        self._status = PolicyStatus()
        self._written: dict[str, Any] | None = None
        self._written_at = 0.0
        """`clock.monotonic()` of the last status write."""

    async def run(self, *, retry_delay: float = 5.0) -> None:
        """Watch until cancelled; waits for the CRD while it is not installed."""
        while True:
            try:
                await self._watch()
            except errors.NotFound:
                log.warning("the GPUClusterPolicy CRD is not installed; looking again later")
                await self._clock.sleep(retry_delay)

    async def _watch(self) -> None:
        async with customobjects.watch(self._kube, RESOURCE, clock=self._clock) as watch:
            async for change in watch:
                name = str(change.object["metadata"]["name"])
                if change.type == "DELETED":
                    self._objects.pop(name, None)
                else:
                    self._objects[name] = change.object
                await self._follow()
                self._on_change()

    async def _follow(self) -> None:
        if not self._objects:
            self.name, self.spec, self.generation = None, None, None
            return
        names = sorted(self._objects)
        if len(names) > 1:
            log.warning("several GPUClusterPolicies (%s); following %s", names, names[0])
        policy = self._objects[names[0]]
        if policy["metadata"].get("generation") == self.generation and names[0] == self.name:
            return
        self.name = names[0]
        self.generation = policy["metadata"].get("generation")
        self._status = PolicyStatus.model_validate(policy.get("status") or {})
        now = self._clock.now()
        try:
            self.spec = validation.validate_spec(policy.get("spec") or {})
        except validation.PolicyInvalid as invalid:
            self.spec = None
            log.warning("GPUClusterPolicy %s is invalid: %s", self.name, invalid.message)
            await self.write_status(invalid.condition(now=now, observed_generation=self.generation))
            return
        self.in_force = self.spec
        await self.write_status(
            validation.valid_condition(now=now, observed_generation=self.generation)
        )

    @property
    def rollout(self) -> RolloutRecord | None:
        """The rollout the status names (written by this or an earlier leader)."""
        return self._status.rollout

    async def write_status(
        self,
        *conditions: Condition,
        nodes: Mapping[UpgradeState, int] | None = None,
        rollout: RolloutRecord | None = None,
        skipped: int | None = None,
        pools: tuple[PoolProgress, ...] | None = None,
        upgraded: str | None = None,
    ) -> None:
        """Set `conditions` (and the node counts, the rollout, the count of nodes admission
        leaves out, the progress per driver pool and in all) in the followed policy's
        status."""
        if self.name is None:
            return
        status = self._status.model_copy(update={"observed_generation": self.generation})
        for new in conditions:
            status = status.with_condition(new)
        if nodes is not None:
            status = status.model_copy(update={"nodes": {str(k): v for k, v in nodes.items()}})
        if rollout is not None:
            status = status.model_copy(update={"rollout": rollout})
        if skipped is not None:
            status = status.model_copy(update={"skipped": skipped})
        if pools is not None:
            summary = ", ".join(f"{p.name} {p.done}/{p.total}" for p in pools)
            status = status.model_copy(update={"pools": pools, "pool_summary": summary})
        if upgraded is not None:
            status = status.model_copy(update={"upgraded": upgraded})
        self._status = status
        wire = status.to_wire()
        if wire == self._written:
            return
        now = self._clock.monotonic()
        progress_only = self._written is not None and _outline(wire) == _outline(self._written)
        if progress_only and now - self._written_at < PROGRESS_INTERVAL:
            return
        patch = dict(wire)
        if self._written is not None:
            # a merge patch keeps keys it does not name: states no node is in any more go,
            # and so do components the rollout no longer installs
            gone = set(self._written.get("nodes") or {}) - set(wire.get("nodes") or {})
            patch["nodes"] = {**dict.fromkeys(gone), **(wire.get("nodes") or {})}
            if "rollout" in wire:
                before = (self._written.get("rollout") or {}).get("versions") or {}
                versions = wire["rollout"]["versions"]
                dropped = dict.fromkeys(set(before) - set(versions))
                patch["rollout"] = {**wire["rollout"], "versions": {**dropped, **versions}}
        try:
            await customobjects.patch_status(self._kube, RESOURCE, self.name, patch)
        except errors.KubeError as error:
            log.warning("could not write the status of GPUClusterPolicy %s: %s", self.name, error)
            return
        self._written, self._written_at = wire, now
