"""The driver upgrade as a saga kind: its table, phases and hooks, handed to the machinery.

table      `gpuop.saga.upgrade.table.TABLE` (upstream's states, gpuop's compensation edges)
phases     `gpuop.saga.upgrade.phases.PHASES`, one module per state
observe    bookkeeping from observations in any state: boot id, the running versions
           (the rollback target while the drivers are untouched), whether the node was
           cordoned before gpuop touched it, the kernel it runs (until the saga ends)
removed    `compensation.node_removed`
announce   the state label and, for some moves, a Kubernetes Event (`drafting`)
limit      `steps.limit_seconds`; effects `effects.step_effects`
"""

from __future__ import annotations

from gpuop.events import Event, kube
from gpuop.events import hardware as hw
from gpuop.events.driver import Component
from gpuop.events.upgrade import TERMINAL_STATES, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Decision, SetStateLabel
from gpuop.saga.machine import Kind
from gpuop.saga.upgrade import compensation
from gpuop.saga.upgrade.drafting import Draft, announce
from gpuop.saga.upgrade.effects import label_id
from gpuop.saga.upgrade.phases import PHASES
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import Step, limit_seconds
from gpuop.saga.upgrade.table import TABLE

S = UpgradeState
NAME = "driver-upgrade"

_BEFORE_RELOAD = frozenset(
    {
        S.UPGRADE_REQUIRED,
        S.CORDON_REQUIRED,
        S.WAIT_FOR_JOBS_REQUIRED,
        S.POD_DELETION_REQUIRED,
        S.DRAIN_REQUIRED,
        S.OPERANDS_PAUSE_REQUIRED,
    }
)


def observe(draft: Draft, event: Event) -> None:
    """Bookkeeping from observations, whatever the state: boot id, running versions, and
    whether the node was cordoned before gpuop touched it."""
    saga = draft.saga
    if saga.state is S.REBOOT_REQUIRED:
        return  # the reboot phase reads the boot id first
    if isinstance(event, kube.NodeObserved | hw.HardwareDiscovered) and event.boot_id:
        draft.update(boot_id=event.boot_id)
    if isinstance(event, hw.HardwareDiscovered) and saga.state not in TERMINAL_STATES:
        # an ended saga keeps the kernel it installed for: another one later is a drift
        draft.update(kernel_release=event.kernel_release, inventory_hash=event.inventory_hash)
    first_look = saga.state is S.UPGRADE_REQUIRED and saga.attempt == 1 and not saga.cordoned
    if isinstance(event, kube.NodeObserved) and first_look:
        draft.update(initially_unschedulable=event.unschedulable)
    if isinstance(event, hw.HardwareDiscovered) and not saga.touched:
        _refresh_previous(draft, event)


def _refresh_previous(draft: Draft, inventory: hw.HardwareDiscovered) -> None:
    """While the drivers are untouched, what the node runs is the rollback target."""
    if draft.saga.state not in _BEFORE_RELOAD:
        return
    running = {Component.GPU: inventory.driver_version, Component.OFED: inventory.ofed_version}
    saga = draft.saga
    previous = dict(saga.previous_versions)
    for component in saga.components:
        version = running[component]
        if version is not None and version != saga.targets[component].version:
            previous[component] = version
    if previous != saga.previous_versions:
        draft.update(previous_versions=previous)


def _limit(saga: NodeSaga, step: Step, spec: GPUClusterPolicySpec) -> float | None:
    return limit_seconds(step, spec.upgrade_policy, saga.attempt)


UPGRADE: Kind[NodeSaga, UpgradeState, Draft] = Kind(
    name=NAME,
    table=TABLE,
    phases=PHASES,
    retry_state=S.UPGRADE_REQUIRED,
    observe=observe,
    removed=compensation.node_removed,
    announce=announce,
    limit=_limit,
    step_type=Step,
)
"""The driver upgrade, the first saga kind."""
UPGRADE.check()


def pending(saga: NodeSaga, policy: GPUClusterPolicySpec) -> Decision:
    """What to issue again for a saga read back after a crash: its state label, the current
    step's commands and actions, and the public events of its latest transitions, with the
    ids they had when first issued (the bus drops what was published already)."""
    return UPGRADE.pending(saga, policy, SetStateLabel(id=label_id(saga), value=saga.state))
