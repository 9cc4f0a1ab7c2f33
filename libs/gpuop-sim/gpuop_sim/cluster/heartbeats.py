"""What a simulated kubelet posts about its node, and what is posted when it goes silent.

:func:`post_node_status` writes the Node's status as a running kubelet reports it
(capacity, allocatable, addresses, ``nodeInfo`` with the current boot id, conditions with
a fresh ``lastHeartbeatTime``), or, for a node whose kubelet stopped, what the node
lifecycle controller writes instead: every condition Unknown and the
``node.kubernetes.io/unreachable`` taints, which come off again once it reports. Heartbeats
also renew the node's Lease in ``kube-node-lease`` (:func:`renew_lease`), and a kubelet
that booted again records upstream's ``Rebooted`` event (:func:`record_rebooted`).
Called by ``kubelet.py``; the objects come from ``machines.py``.
"""

from __future__ import annotations

import random
from typing import Any

from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.timestamps import format_micro_time, format_time
from gpuop_sim.cluster import machines
from gpuop_sim.cluster.machines import Machine
from gpuop_sim.cluster.wakeups import unless_gone

Obj = dict[str, Any]

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40


def post_node_status(registry: Registry, machine: Machine, *, reachable: bool) -> None:
    """A kubelet's status report, or the lifecycle controller's verdict on a silent one."""
    now = registry.clock.now()
    fresh = machines.node_object(machine, now)["status"]

    def status(node: Obj) -> None:
        previous = (node.get("status") or {}).get("conditions") or []
        if reachable:
            node["status"] = {**fresh, "conditions": machines.reported_conditions(previous, now)}
        else:
            conditions = machines.unknown_conditions(previous, now)
            node.setdefault("status", {})["conditions"] = conditions

    def taints(node: Obj) -> None:
        spec = node.setdefault("spec", {})
        kept = [t for t in spec.get("taints") or [] if t.get("key") != machines.UNREACHABLE]
        if not reachable:
            kept += machines.unreachable_taints(now)
        if kept:
            spec["taints"] = kept
        else:
            spec.pop("taints", None)

    with unless_gone():
        registry.mutate(kinds.NODES, "", machine.name, status, subresource="status")
        registry.mutate(kinds.NODES, "", machine.name, taints)


def renew_lease(registry: Registry, node: str) -> None:
    """Renew the node's Lease, creating it (owned by the Node) when there is none."""
    renewed = format_micro_time(registry.clock.now())
    if registry.store.get(kinds.LEASES.group_resource, LEASE_NAMESPACE, node) is not None:

        def renew(lease: Obj) -> None:
            lease["spec"]["renewTime"] = renewed

        registry.mutate(kinds.LEASES, LEASE_NAMESPACE, node, renew)
        return
    registered = registry.store.get(kinds.NODES.group_resource, "", node)
    if registered is None:  # deleted by a client: the kubelet only registers when it starts
        return
    uid = registered["metadata"]["uid"]
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
    lease = {
        "metadata": {"name": node, "ownerReferences": [owner]},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": renewed,
        },
    }
    registry.create(kinds.LEASES, LEASE_NAMESPACE, lease)


def record_rebooted(registry: Registry, machine: Machine, rng: random.Random) -> None:
    """The kubelet's ``Rebooted`` warning, naming the new boot id."""
    stamp = format_time(registry.clock.now())
    node = machine.name
    event = {
        "metadata": {"name": f"{node}.{rng.getrandbits(64):016x}"},
        "involvedObject": {"kind": "Node", "name": node, "uid": node},
        "reason": "Rebooted",
        "message": f"Node {node} has been rebooted, boot id: {machine.boot_id}",
        "source": {"component": "kubelet", "host": node},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "type": "Warning",
        "reportingComponent": "kubelet",
        "reportingInstance": node,
    }
    registry.create(kinds.EVENTS, "default", event)
