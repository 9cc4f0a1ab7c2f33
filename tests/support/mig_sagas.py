"""A driver for the MIG reconfiguration kind in tests: a node of four H200s, a mig-parted
file, a policy, a fake time, and the answers each step's executor gives.

`MigRun` makes the saga as the runtime would (`plans.plan`, `records.new_saga`,
`kind.begin`), feeds it events through `kind.decide` with the saga each decision returns,
and keeps every decision; `ok()` answers the pending step with its success, `expire()`
fires its deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuop.events import device as dev
from gpuop.events import hardware as hw
from gpuop.events import ids, kube
from gpuop.events import mig_commands as migev
from gpuop.events import remediation_commands as rem
from gpuop.events.fields import NamespacedName
from gpuop.policy import DriverSpec, GPUClusterPolicySpec
from gpuop.policy.drivers import ComponentSpec
from gpuop.policy.mig import MigPolicy
from gpuop.policy.migconfig import parse
from gpuop.saga import machine
from gpuop.saga.mig import kind, plans, records
from gpuop.saga.mig.records import MigSaga, MigStepKind
from gpuop.saga.mig.states import MigState

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NODE = "gpu-node-1"
REQUEST = "0123456789abcdef0123456789abcdef"
UUIDS = tuple(f"GPU-{i:08x}-0000-4000-8000-00000000000{i}" for i in range(4))
POD_A = NamespacedName(namespace="ml", name="train-a")
POD_B = NamespacedName(namespace="ml", name="infer-b")
CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - device-filter: ["0x233510DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  half-balanced:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    - devices: [2, 3]
      mig-enabled: false
  first-two:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  bad-index:
    - devices: [9]
      mig-enabled: false
"""
"""A mig-parted file: `half-balanced` re-carves GPUs 0 and 1 of a node with MIG off (4
devices each) and turns MIG off on 2 and 3 (a no-op when it is off); `first-two` re-carves 0
and 1 and leaves 2 and 3 alone."""
BALANCED = 4
"""MIG devices per GPU under `all-balanced`."""


SLICES = {"1g.18gb": 1, "2g.35gb": 2, "3g.71gb": 3, "7g.141gb": 7}


def carved(index: int, devices: Mapping[str, int]) -> tuple[hw.MigInstance, ...]:
    """The MIG devices discovery reports of GPU `index` carved as `devices`."""
    found = []
    for profile, count in sorted(devices.items()):
        for _ in range(count):
            found.append(
                hw.MigInstance(
                    uuid=f"MIG-{index:08x}-0000-4000-8000-{len(found):012x}",
                    profile=profile,
                    gpu_instance_slices=SLICES[profile],
                    compute_instance_slices=SLICES[profile],
                    memory_bytes=SLICES[profile] * 18 * 2**30,
                    multiprocessors=SLICES[profile] * 16,
                )
            )
    return tuple(found)


def gpu(
    index: int, mig: hw.MigMode = hw.MigMode.DISABLED, devices: Mapping[str, int] | None = None
) -> hw.Gpu:
    return hw.Gpu(
        mig_devices=carved(index, devices or {}),
        uuid=UUIDS[index],
        index=index,
        minor_number=index,
        pci_bus_id=f"00000000:{0x17 + index:02x}:00.0",
        model_name="NVIDIA H200",
        memory_bytes=150754820096,
        mig_mode=mig,
        compute_capability="9.0",
    )


def inventory(
    *enabled: int,
    count: int = 4,
    device_id: str = "2335",
    devices: Mapping[int, Mapping[str, int]] | None = None,
) -> hw.HardwareDiscovered:
    """A node of `count` H200s, MIG on for the indexes `enabled` and those in `devices`
    (their MIG devices as discovery reports them; none reported for the others)."""
    devices = devices or {}
    gpus = tuple(
        gpu(
            i,
            hw.MigMode.ENABLED if i in enabled or i in devices else hw.MigMode.DISABLED,
            devices.get(i),
        )
        for i in range(count)
    )
    functions = tuple(
        hw.PciFunction(
            address=f"0000:{0x17 + i:02x}:00.0",
            vendor_id="10de",
            device_id=device_id,
            class_id="030200",
            subsystem_vendor_id="10de",
            subsystem_device_id="18be",
            driver="nvidia",
        )
        for i in range(count)
    )
    return hw.HardwareDiscovered(
        gpus=gpus,
        pci_functions=functions,
        kernel_release="6.1.0-44-amd64",
        machine="x86_64",
        boot_id="aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa",
        driver_version="580.2",
        inventory_hash="0" * 64,
    )


def policy(**mig: Any) -> GPUClusterPolicySpec:
    """A policy with `CONFIG` inline and `mig` as the rest of its `mig` section."""
    return GPUClusterPolicySpec(
        driver=DriverSpec(gpu=ComponentSpec(version="580.2")),
        mig=MigPolicy(**{"config": CONFIG, **mig}),
    )


def plan_for(
    config: str, node: hw.HardwareDiscovered | None = None, text: str | None = CONFIG
) -> plans.MigPlan:
    file = None if text is None else parse(text)
    source = "the policy's mig.config" if text is not None else "no MIG configs"
    return plans.plan(config, file, source, inventory() if node is None else node)


class MigRun:
    """One MIG saga driven through the kind, with every decision kept."""

    def __init__(
        self,
        config: str = "half-balanced",
        *,
        spec: GPUClusterPolicySpec | None = None,
        node: hw.HardwareDiscovered | None = None,
        plan: plans.MigPlan | None = None,
    ) -> None:
        self.policy = spec or policy()
        self.now = T0
        the_plan = plan or plan_for(config, node)
        saga = records.new_saga(node=NODE, request_id=REQUEST, plan=the_plan, now=T0)
        first = kind.begin(saga, self.policy, T0)
        self.saga: MigSaga = first.saga
        self.decisions: list[kind.Decision] = [first]
        self.triggers: list[tuple[machine.Trigger, datetime]] = []

    def feed(self, trigger: machine.Trigger, after: float = 1.0) -> kind.Decision:
        self.now += timedelta(seconds=after)
        decision = kind.decide(self.saga, trigger, self.policy, self.now)
        self.triggers.append((trigger, self.now))
        self.saga = decision.saga
        self.decisions.append(decision)
        return decision

    def admit(self) -> kind.Decision:
        return self.feed(machine.Admitted())

    def expire(self) -> kind.Decision:
        expired = machine.deadline_event(self.saga)
        assert expired is not None, f"{self.saga.step.token} has no deadline"
        assert self.saga.deadline is not None
        self.now = self.saga.deadline
        return self.feed(expired, after=0)

    @property
    def state(self) -> MigState:
        return self.saga.state

    @property
    def step_id(self) -> str:
        return ids.step(self.saga.saga_id, self.saga.step.token, self.saga.attempt)

    def ok(self, *, holders: tuple[NamespacedName, ...] = (POD_A,), devices: int | None = None
    ) -> kind.Decision:  # fmt: skip
        """Answer the pending step with its success."""
        saga, step_id = self.saga, self.step_id
        step = saga.step.kind
        if step is MigStepKind.ADMISSION:
            return self.admit()
        if step is MigStepKind.OPERANDS_PAUSE:
            for service in saga.operands:
                decision = self.feed(dev.OperandPaused(command_id=step_id, service=service))
            return decision
        if step is MigStepKind.OPERANDS_RESUME:
            for service in saga.operands:
                decision = self.feed(dev.OperandResumed(command_id=step_id, service=service))
            return decision
        if step is MigStepKind.LIST_HOLDERS:
            gpus = tuple(g.uuid for g in saga.plan.recarved)
            listed = rem.GpuHoldersListed(command_id=step_id, gpu_uuids=gpus, pods=holders)
            return self.feed(listed)
        if step is MigStepKind.EVICT_HOLDERS:
            return self.feed(kube.PodsDeleted(action_id=step_id, deleted=len(saga.holders)))
        if step in (MigStepKind.APPLY, MigStepKind.REAPPLY, MigStepKind.RESTORE):
            return self.feed(self.applied(devices))
        raise AssertionError(f"no success answer for {step}")

    def applied(self, devices: int | None = None, **fields: Any) -> migev.MigLayoutApplied:
        plan = self.saga.plan
        wanted = sum(d.count for layout in plan.layouts for d in layout.devices)
        values: dict[str, Any] = {
            "command_id": self.step_id,
            "config": plan.config,
            "changed_gpus": tuple(g.index for g in plan.recarved),
            "mig_devices": wanted if devices is None else devices,
        }
        return migev.MigLayoutApplied(**{**values, **fields})

    def apply_failed(
        self, restored: bool, reason: migev.MigFailureReason = migev.MigFailureReason.APPLY_FAILED
    ) -> kind.Decision:
        failed = migev.MigLayoutFailed(
            command_id=self.step_id,
            config=self.saga.config,
            reason=reason,
            restored=restored,
            message="nvmlDeviceCreateGpuInstance: insufficient resources",
        )
        return self.feed(failed)

    def until(self, state: MigState, limit: int = 20) -> None:
        """Answer every step with success until the saga is in `state`."""
        for _ in range(limit):
            if self.saga.state is state:
                return
            self.ok()
        raise AssertionError(f"never reached {state}: at {self.saga.state}")

    def states(self) -> list[MigState]:
        """Every state the saga entered, in order, from the moves of every decision."""
        return [t.to_state for d in self.decisions for t in d.transitions]

    def commands(self) -> list[Any]:
        return [c.payload for d in self.decisions for c in d.commands]

    def actions(self) -> list[Any]:
        return [a for d in self.decisions for a in d.kube_actions]
