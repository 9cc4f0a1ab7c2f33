"""Delete options and the deletion rules a real API server applies before removing.

``DeleteOptions`` comes from a DELETE body, its query parameters or an Eviction's
``deleteOptions``. The rules: preconditions on ``uid`` and ``resourceVersion`` (409 when
they do not hold), the grace period (only a pod bound to a node and not yet finished
terminates gracefully; its default is ``spec.terminationGracePeriodSeconds``), and the
stand-in kubelet that confirms a terminating pod is gone after a configurable delay.
Used by the registry's delete, by eviction and by the HTTP handlers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuop_sim.apiserver import errors, kinds
from gpuop_sim.apiserver.resources import ResourceType

Obj = dict[str, Any]


@dataclass(frozen=True)
class DeleteOptions:
    """``metav1.DeleteOptions``."""

    grace_period_seconds: int | None = None
    propagation_policy: str | None = None
    """``Orphan``, ``Background`` or ``Foreground`` (treated as ``Background``)."""
    precondition_uid: str | None = None
    precondition_resource_version: str | None = None
    dry_run: bool = False

    @staticmethod
    def from_body(body: Obj | None) -> DeleteOptions:
        """From a JSON ``DeleteOptions`` object (a DELETE body or ``deleteOptions``)."""
        body = body or {}
        preconditions = body.get("preconditions") or {}
        policy = body.get("propagationPolicy")
        if policy is None and body.get("orphanDependents") is not None:
            policy = "Orphan" if body["orphanDependents"] else "Background"
        return DeleteOptions(
            grace_period_seconds=body.get("gracePeriodSeconds"),
            propagation_policy=policy,
            precondition_uid=preconditions.get("uid"),
            precondition_resource_version=preconditions.get("resourceVersion"),
            dry_run="All" in (body.get("dryRun") or []),
        )


@dataclass(frozen=True)
class Deletion:
    """The outcome of a delete: the object, and whether it is gone or only terminating."""

    object: Obj
    removed: bool


def check_preconditions(resource: ResourceType, obj: Obj, options: DeleteOptions) -> None:
    metadata = obj["metadata"]
    name = metadata["name"]
    if options.precondition_uid and options.precondition_uid != metadata["uid"]:
        raise errors.precondition_failed(
            resource.group_resource,
            resource.kind,
            name,
            f"the UID in the precondition ({options.precondition_uid}) does not match the UID "
            f"in record ({metadata['uid']}). The object might have been deleted and then "
            "recreated",
        )
    wanted = options.precondition_resource_version
    if wanted and wanted != metadata["resourceVersion"]:
        raise errors.precondition_failed(
            resource.group_resource,
            resource.kind,
            name,
            f"the ResourceVersion in the precondition ({wanted}) does not match the "
            f"ResourceVersion in record ({metadata['resourceVersion']}). The object might "
            "have been modified",
        )


def grace_period(resource: ResourceType, obj: Obj, options: DeleteOptions) -> int:
    """Seconds the object may take to go; only a running pod on a node gets any."""
    if resource.group_resource != kinds.PODS.group_resource:
        return 0
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if options.grace_period_seconds is not None:
        period = options.grace_period_seconds
    else:
        period = spec.get("terminationGracePeriodSeconds", 30)
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return 0
    return max(int(period), 0)


PodKey = tuple[str, str]


class StandInKubelet:
    """Confirms terminating pods after ``delay`` seconds (capped by their grace period),
    as a node's kubelet would once the containers stop. A delay of None confirms nothing:
    a simulated kubelet then calls the registry's ``complete_pod_termination`` itself."""

    def __init__(self, delay: float | None, confirm: Callable[[PodKey, str], None]) -> None:
        self.delay = delay
        self._confirm = confirm
        self._timers: dict[PodKey, asyncio.TimerHandle] = {}

    def pod_terminating(self, pod: Obj, grace: int) -> None:
        if self.delay is None:
            return
        metadata = pod["metadata"]
        key = (metadata["namespace"], metadata["name"])
        self.pod_gone(key)
        self._timers[key] = asyncio.get_running_loop().call_later(
            min(self.delay, grace), self._fire, key, metadata["uid"]
        )

    def pod_gone(self, key: PodKey) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _fire(self, key: PodKey, uid: str) -> None:
        self._timers.pop(key, None)
        self._confirm(key, uid)
