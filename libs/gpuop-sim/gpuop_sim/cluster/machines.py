"""Simulated GPU machines and the Node objects their kubelets report.

A :class:`Machine` is one host of the simulated cluster: its name, its place in the
cluster (which fixes its addresses and pod CIDR), its :class:`MachineType` and the
identities a kubelet reports in ``status.nodeInfo``: a machine id and system UUID that
never change, and a boot id that changes on every boot. ``cluster.py`` creates the
machines; the kubelet (``kubelet.py``) registers :func:`node_object` and rewrites the
conditions with :func:`reported_conditions` while it runs, and the node lifecycle rules
there use :func:`unknown_conditions` and :func:`unreachable_taints` when it stops.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuop_sim.apiserver.discovery import KUBERNETES_VERSION
from gpuop_sim.apiserver.timestamps import format_time

Obj = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
KUBELET_VERSION = KUBERNETES_VERSION
"""Kubelets run the control plane's release, as on a freshly installed cluster."""
KERNEL_VERSION = "6.8.0-49-generic"
OS_IMAGE = "Ubuntu 24.04.1 LTS"
CONTAINER_RUNTIME = "containerd://1.7.22"
MAX_PODS = 110

UNREACHABLE = "node.kubernetes.io/unreachable"
NODE_STATUS_UNKNOWN = "Kubelet stopped posting node status."


@dataclass(frozen=True)
class MachineType:
    """What ``node.kubernetes.io/instance-type`` names: CPUs, memory and GPUs."""

    name: str
    cpus: int
    memory_gib: int
    gpus: int


P5E_48XLARGE = MachineType("p5e.48xlarge", cpus=192, memory_gib=2048, gpus=8)
"""Eight NVIDIA H200 GPUs, the machine the recorded host fixture comes from."""


def machine_type(gpus: int) -> MachineType:
    """The 8-GPU H200 instance, or a proportional H200 machine for other GPU counts."""
    if gpus == P5E_48XLARGE.gpus:
        return P5E_48XLARGE
    size = max(gpus, 1)
    return MachineType(f"sim.h200-{gpus}x", cpus=24 * size, memory_gib=256 * size, gpus=gpus)


@dataclass
class Machine:
    """One simulated host; ``boot_id`` changes when it boots again."""

    name: str
    index: int
    type: MachineType
    machine_id: str
    system_uuid: str
    boot_id: str
    device_resources: dict[str, tuple[int, int]] | None = None
    """The device plugins' resources as the kubelet's device manager counts them, resource
    -> (capacity: devices advertised, allocatable: the healthy ones), which the kubelet's
    status reports in place of the machine's `nvidia.com/gpu`; None: that count alone (no
    device manager joined to this machine: `gpuop demo`'s scenarios join one)."""

    @staticmethod
    def create(name: str, index: int, kind: MachineType, rng: random.Random) -> Machine:
        return Machine(
            name,
            index,
            kind,
            machine_id=f"{rng.getrandbits(128):032x}",
            system_uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            boot_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        )

    def boot(self, rng: random.Random) -> str:
        """Boot again: a new boot id, as ``/proc/sys/kernel/random/boot_id`` gives."""
        self.boot_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return self.boot_id

    @property
    def internal_ip(self) -> str:
        return f"10.0.{self.index // 200}.{self.index % 200 + 10}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    def pod_ip(self, host: int) -> str:
        return f"10.244.{self.index}.{host}"


def _resources(machine: Machine, *, allocatable: bool) -> Obj:
    kind = machine.type
    memory_ki = kind.memory_gib * 1024 * 1024 - (1_700_000 if allocatable else 0)
    storage_ki = 1_000_000_000
    resources: Obj = {
        "cpu": f"{kind.cpus * 1000 - 100}m" if allocatable else str(kind.cpus),
        "ephemeral-storage": str(storage_ki * 1024 * 9 // 10) if allocatable else f"{storage_ki}Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{memory_ki}Ki",
        "pods": str(MAX_PODS),
    }
    if machine.device_resources is not None:
        for resource, counts in sorted(machine.device_resources.items()):
            resources[resource] = str(counts[1] if allocatable else counts[0])
    elif kind.gpus:
        resources[GPU_RESOURCE] = str(kind.gpus)
    return resources


def node_object(machine: Machine, now: datetime) -> Obj:
    """The Node a kubelet registers for ``machine``, Ready as of ``now``."""
    kind = machine.type
    name = machine.name
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/instance-type": kind.name,
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": kind.name,
                "topology.kubernetes.io/region": "sim-1",
                "topology.kubernetes.io/zone": f"sim-1{'abc'[machine.index % 3]}",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": machine.pod_cidr,
            "podCIDRs": [machine.pod_cidr],
            "providerID": f"sim:///sim-1/{name}",
        },
        "status": {
            "capacity": _resources(machine, allocatable=False),
            "allocatable": _resources(machine, allocatable=True),
            "conditions": reported_conditions([], now),
            "addresses": [
                {"type": "InternalIP", "address": machine.internal_ip},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": node_info(machine),
        },
    }


def node_info(machine: Machine) -> Obj:
    return {
        "machineID": machine.machine_id,
        "systemUUID": machine.system_uuid,
        "bootID": machine.boot_id,
        "kernelVersion": KERNEL_VERSION,
        "osImage": OS_IMAGE,
        "containerRuntimeVersion": CONTAINER_RUNTIME,
        "kubeletVersion": KUBELET_VERSION,
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": "amd64",
    }


_HEALTHY = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "is posting ready status"),
)
"""Condition type, status, reason and message (after "kubelet ") of a healthy node."""


def _transition_time(previous: list[Obj], kind: str, status: str, now: str) -> str:
    for condition in previous:
        if condition.get("type") == kind and condition.get("status") == status:
            return str(condition.get("lastTransitionTime") or now)
    return now


def reported_conditions(previous: list[Obj], now: datetime) -> list[Obj]:
    """A running kubelet's conditions, heartbeat ``now``; transitions keep their time. The
    conditions of other types (another component's, such as ``GPUHealthy``) are kept, as
    the kubelet's status patch keeps them."""
    stamp = format_time(now)
    return [
        {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": _transition_time(previous, kind, status, stamp),
            "reason": reason,
            "message": f"kubelet {message}",
        }
        for kind, status, reason, message in _HEALTHY
    ] + _others(previous)


def _others(previous: list[Obj]) -> list[Obj]:
    """The conditions the kubelet does not own, as they were."""
    owned = {kind for kind, *_ in _HEALTHY}
    return [c for c in previous if c.get("type") not in owned]


def unknown_conditions(previous: list[Obj], now: datetime) -> list[Obj]:
    """What the node lifecycle controller writes once the kubelet stops posting status:
    every condition Unknown, the last heartbeat kept."""
    stamp = format_time(now)
    return [
        {
            "type": kind,
            "status": "Unknown",
            "lastHeartbeatTime": next(
                (c.get("lastHeartbeatTime") for c in previous if c.get("type") == kind), stamp
            ),
            "lastTransitionTime": _transition_time(previous, kind, "Unknown", stamp),
            "reason": "NodeStatusUnknown",
            "message": NODE_STATUS_UNKNOWN,
        }
        for kind, *_ in _HEALTHY
    ] + _others(previous)


def unreachable_taints(now: datetime) -> list[Obj]:
    """The taints the node lifecycle controller puts on a node whose kubelet went silent."""
    return [
        {"key": UNREACHABLE, "effect": "NoSchedule"},
        {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": format_time(now)},
    ]
