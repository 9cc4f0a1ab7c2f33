"""The `upgradePolicy` section: how a rolling driver upgrade treats nodes and workloads.

The fields and defaults up to `drain` are upstream's (`DriverUpgradePolicySpec` of
NVIDIA/k8s-operator-libs, with the GPU Operator's defaults: `autoUpgrade` true,
`maxParallelUpgrades` 1, `maxUnavailable` 25%, pod deletion timeout 300 s, drain disabled
with timeout 300 s), so a GPU Operator policy carries over. The rest are gpuop's: which
nodes a rollout manages (`nodeSelector`), pausing it (`paused`, what `gpuop upgrade pause`
sets), what to do with nodes someone else cordoned (`cordonedNodes`), a reboot when the
driver will not unload, rollback, whether failed nodes hold a slot, retries, deadlines for
every wait (`gpuop.policy.deadlines`) and a canary.

`unavailable_budget` is the `maxUnavailable` arithmetic (the one place it is done): every
saga kind's admission takes the budget from it. The orchestrator's controller reads
`node_selector` when it picks the managed nodes. The decision core reads an `UpgradePolicy`
for admission (`paused`, `max_unavailable`, `max_parallel_upgrades`,
`failed_nodes_hold_slot`, `canary`, `cordoned_nodes`, `waves`, `maintenance_windows`), for
the waits of each step (`wait_for_jobs_limit`, `pod_deletion_limit`, `drain_limit`,
`deadlines`) and for retries (`backoff`, `retry.max_attempts`).
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from gpuop.policy.deadlines import Deadlines, Retry
from gpuop.policy.fields import Section, TimeoutSeconds
from gpuop.policy.ladders import Validation
from gpuop.policy.selectors import LabelSelector

PERCENT_PATTERN = r"^(100|[1-9][0-9]?)%$"
"""A percentage of nodes for `maxUnavailable`: `1%` to `100%`."""
_PERCENT = re.compile(PERCENT_PATTERN)


@dataclass(frozen=True)
class Budget:
    """The cluster's one `maxUnavailable` budget at one moment, shared by every saga kind."""

    total: int
    """Managed nodes (that exist)."""
    max_unavailable: int
    """`maxUnavailable` as a number of nodes out of `total`."""
    unavailable: int
    """Nodes unavailable now (NotReady, cordoned, or held by a saga)."""
    free: int
    """How many more nodes may become unavailable now."""


def unavailable_budget(max_unavailable: int | str, total: int, unavailable: int) -> Budget:
    """The `maxUnavailable` arithmetic, the one place it is done: `max_unavailable` (a
    count, or a percentage of `total` like `"25%"`) as a node count, and how many more nodes
    may go down while `unavailable` are down already.

    Upstream's `GetUpgradesAvailable` arithmetic: a percentage is rounded up, and is at
    least 1 whenever there is a node; a count (or a percentage over 100) is capped at
    `total`. Nothing is free once `unavailable` reaches the count; otherwise what is left of
    it, or all of it when the count covers every node (upstream cuts only a budget smaller
    than the cluster). No node, no budget."""
    if total <= 0:
        count = 0
    elif isinstance(max_unavailable, int):
        count = max(0, min(max_unavailable, total))
    else:
        percent = int(max_unavailable.removesuffix("%"))
        count = max(1, min(total, -(-total * percent // 100)))
    if unavailable >= count:
        free = 0
    elif count < total:
        free = count - unavailable
    else:
        free = count
    return Budget(total=total, max_unavailable=count, unavailable=unavailable, free=free)


CordonedNodes = Literal["upgradeFirst", "skip"]
"""What admission does with a node someone else cordoned (`cordonedNodes`)."""


def _bounded(timeout_seconds: int, deadline_seconds: int) -> int:
    """The effective limit of a wait: the upstream timeout when it is set and shorter."""
    if timeout_seconds == 0:
        return deadline_seconds
    return min(timeout_seconds, deadline_seconds)


class WaitForCompletion(Section):
    """Waiting for running jobs to finish before GPU pods are deleted."""

    pod_selector: LabelSelector = ""
    """Label selector of the pods (usually jobs) to wait for; empty: do not wait."""
    timeout_seconds: TimeoutSeconds = 0
    """How long to wait for them, then go on. 0 is upstream's "wait forever"; gpuop accepts
    it, but `deadlines.waitForJobs` still bounds the wait."""


class PodDeletion(Section):
    """Deleting the pods that use GPUs on a node before its driver is reloaded."""

    force: bool = False
    """Also delete GPU pods that no controller manages (they will not be recreated)."""
    timeout_seconds: TimeoutSeconds = 300
    """How long to wait for the deleted pods to be gone; the step fails after that. 0 (no
    limit upstream) is accepted, but `deadlines.podDeletion` still bounds the wait."""
    delete_empty_dir: bool = False
    """Also delete GPU pods with emptyDir volumes (their local data is lost)."""


class Drain(Section):
    """Draining the whole node, as `kubectl drain` does, after the GPU pods are deleted."""

    enable: bool = False
    """Drain the node (evicting every pod, honouring PodDisruptionBudgets) before the reload."""
    force: bool = False
    """Also evict pods that no controller manages."""
    pod_selector: LabelSelector = ""
    """Label selector limiting which pods are drained; empty: every pod but DaemonSet pods."""
    timeout_seconds: TimeoutSeconds = 300
    """How long the drain may take; the step fails after that. 0 (no limit upstream) is
    accepted, but `deadlines.drain` still bounds the wait."""
    delete_empty_dir: bool = False
    """Also evict pods with emptyDir volumes (their local data is lost)."""


class Canary(Section):
    """Upgrading a few nodes first, and the rest only once those work."""

    nodes: int = Field(default=0, ge=0, le=100_000)
    """How many nodes to upgrade first (still within `maxParallelUpgrades` and
    `maxUnavailable`); the other nodes are admitted only after every canary node reached
    `upgrade-done`. A canary that fails holds the rest of the rollout back until it succeeds
    on a retry. 0: no canary."""


class Waves(Section):
    """Upgrading one failure domain after another."""

    topology_label: str = Field(default="", max_length=317, pattern=r"^([A-Za-z0-9./_-]*)$")
    """Node label whose value names a node's failure domain (`topology.kubernetes.io/zone`, a
    rack label, or `nvidia.com/gpu.clique` for an NVLink domain); empty: no waves. Nodes are
    admitted one domain at a time, in the order of the values: no node of the next domain is
    admitted while a node of an earlier one waits or is under way. Nodes without the label
    come last. A node that failed does not hold its domain back (as it holds no slot)."""


def _listed(value: object) -> object:
    """A JSON list as the tuple the frozen, hashable policy keeps."""
    return tuple(value) if isinstance(value, list) else value


Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
WEEKDAYS: tuple[Weekday, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_CLOCK_TIME = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


class MaintenanceWindow(Section):
    """A recurring time in which nodes may be admitted."""

    days: Annotated[tuple[Weekday, ...], BeforeValidator(_listed)] = Field(
        default=WEEKDAYS, min_length=1, max_length=7
    )
    """The days it opens on (the start's day, for a window that runs past midnight)."""
    start: str = Field(pattern=_CLOCK_TIME)
    """When it opens, `HH:MM` in `timeZone`."""
    end: str = Field(pattern=_CLOCK_TIME)
    """When it closes, `HH:MM`; at or before `start`: the next day."""
    time_zone: str = "UTC"
    """An IANA time zone (`Europe/Berlin`); the window follows its daylight saving."""

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise PydanticCustomError(
                "time_zone", "{value} is not an IANA time zone", {"value": value}
            ) from None
        return value

    def contains(self, moment: datetime) -> bool:
        """Whether `moment` (aware) falls inside an opening of this window."""
        local = moment.astimezone(zoneinfo.ZoneInfo(self.time_zone))
        opens, closes = _minutes(self.start), _minutes(self.end)
        now = local.hour * 60 + local.minute
        today = WEEKDAYS[local.weekday()]
        yesterday = WEEKDAYS[(local.weekday() - 1) % 7]
        if opens < closes:
            return today in self.days and opens <= now < closes
        # runs past midnight: the evening of an opening day, or the morning after one
        return (today in self.days and now >= opens) or (yesterday in self.days and now < closes)


def _minutes(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


class UpgradePolicy(Section):
    """How gpuop rolls a driver change across the nodes."""

    auto_upgrade: bool = True
    """Start a rolling upgrade by itself when the desired driver versions change. When
    false, a version change upgrades nothing until `gpuop upgrade start`."""
    paused: bool = False
    """Admit no further node while true: nodes already past `upgrade-required` finish their
    upgrade, the others wait. `gpuop upgrade pause` sets it, `gpuop upgrade resume` clears
    it; the `Progressing` condition says `RolloutPaused` meanwhile."""
    node_selector: LabelSelector = ""
    """Label selector of the GPU nodes the rollout manages (`kubectl get -l` syntax, such as
    `pool=training,zone in (a,b)`); empty: every GPU node. Nodes it leaves out get no new
    saga and do not count in `maxUnavailable`; one already upgrading finishes, holding its
    slot meanwhile. `gpuop upgrade start --selector` sets it."""
    max_parallel_upgrades: int = Field(default=1, ge=0, le=100_000)
    """How many nodes may be upgrading at once; 0: no limit (then only `maxUnavailable`
    limits the rollout)."""
    max_unavailable: int | str = Field(
        default="25%",
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "minimum": 1,
            "pattern": PERCENT_PATTERN,
        },
    )
    """How many nodes may be unavailable at once, as a number (at least 1) or a percentage
    of the managed nodes (`25%`, rounded up). NotReady and cordoned nodes count, whatever
    made them so: the rollout admits a node only while it stays within this."""
    cordoned_nodes: CordonedNodes = "upgradeFirst"
    """A node waiting for its upgrade that someone else cordoned (an administrator, another
    controller). `upgradeFirst`, upstream's way: it is admitted before the others, even with
    no slot left, since its capacity is lost already. `skip`: it is left out, counted as
    skipped in the status, until it is uncordoned (a node cordoned for repair is not
    upgraded meanwhile). Either way it counts against `maxUnavailable`."""
    waves: Waves = Waves()
    """Admitting one failure domain (zone, rack, NVLink clique) after another."""
    maintenance_windows: Annotated[tuple[MaintenanceWindow, ...], BeforeValidator(_listed)] = Field(
        default=(), max_length=32
    )
    """When nodes may be admitted; empty: at any time. Outside every window nothing is
    admitted, and nodes already admitted finish their upgrade."""
    wait_for_completion: WaitForCompletion = WaitForCompletion()
    """Waiting for running jobs before GPU pods are deleted."""
    pod_deletion: PodDeletion = PodDeletion()
    """Deleting the GPU pods of a node before its driver reload."""
    drain: Drain = Drain()
    """Draining the node before its driver reload."""
    reboot_on_unload_failure: bool = False
    """When the running driver cannot be unloaded (its modules are in use), reboot the node
    into the new driver instead of failing the step. The reboot counts as done only when the
    node reports a new boot id."""
    rollback_on_failure: bool = True
    """When a step after the unload fails, restore and validate the previous driver before
    the node is uncordoned. When false, the node stays cordoned in `upgrade-failed`."""
    configure_runtime: bool = False
    """Give the node's containerd or CRI-O the `nvidia` runtime handler with CDI (the chart's
    RuntimeClass `nvidia`) in the maintenance window, after the new driver is loaded: the
    runtime restarts while the node is drained, and a runtime that does not answer again is
    put back as it was and fails the step. A no-op on a node configured already."""
    failed_nodes_hold_slot: bool = False
    """Whether a node in `upgrade-failed` counts against `maxParallelUpgrades`, as upstream
    counts it. False: one broken node never stops the others (it still counts against
    `maxUnavailable` while it is cordoned)."""
    retry: Retry = Retry()
    """Retrying a node whose upgrade failed."""
    deadlines: Deadlines = Deadlines()
    """The longest each step may take; they bound every wait."""
    canary: Canary = Canary()
    """Upgrading a few nodes first."""
    validation: Validation = Validation()
    """The ladder of checks before the uncordon (NVML, CUDA, peermem, a GPU pod)."""

    @field_validator("max_unavailable", mode="before")
    @classmethod
    def _int_or_percent(cls, value: object) -> object:
        if isinstance(value, bool) or not (
            (isinstance(value, int) and value >= 1)
            or (isinstance(value, str) and _PERCENT.match(value))
        ):
            raise PydanticCustomError(
                "int_or_percent", 'must be an integer >= 1 or a percentage like "25%"'
            )
        return value

    def max_unavailable_of(self, total_nodes: int) -> int:
        """`maxUnavailable` as a number of nodes out of `total_nodes` (`unavailable_budget`:
        a percentage rounded up, a number capped at the total)."""
        return unavailable_budget(self.max_unavailable, total_nodes, 0).max_unavailable

    def backoff(self, attempt: int) -> float:
        """Seconds before the next try after try number `attempt` (from 1) failed."""
        return self.retry.backoff(attempt)

    @property
    def wait_for_jobs_limit(self) -> int:
        """Seconds the wait for jobs may last: its timeout if set and shorter than the
        deadline, else `deadlines.waitForJobs`."""
        return _bounded(self.wait_for_completion.timeout_seconds, self.deadlines.wait_for_jobs)

    @property
    def pod_deletion_limit(self) -> int:
        """Seconds GPU pod deletion may last: `podDeletion.timeoutSeconds` if set and
        shorter than the deadline, else `deadlines.podDeletion`."""
        return _bounded(self.pod_deletion.timeout_seconds, self.deadlines.pod_deletion)

    @property
    def drain_limit(self) -> int:
        """Seconds the drain may last: `drain.timeoutSeconds` if set and shorter than the
        deadline, else `deadlines.drain`."""
        return _bounded(self.drain.timeout_seconds, self.deadlines.drain)
