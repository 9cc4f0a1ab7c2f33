"""The simulated kubelet of one node, with the node lifecycle rules for when it stops.

While its machine is up, a :class:`Kubelet` registers the Node, posts a heartbeat (Node
conditions and its Lease in ``kube-node-lease``) every ``heartbeat_interval`` seconds,
and runs the pods bound to its node. Admission is code; the rest is the table of stages in
``stages.py`` (KWOK's way), which the kubelet interprets on each pass:

- admission: pods are admitted oldest first while their ``nvidia.com/gpu`` requests fit
  next to those already admitted; a pod bound directly to a full node is refused, Failed
  with reason ``OutOfnvidia.com/gpu`` and the kubelet's message;
- start: an admitted pod turns Running, every container ready, with a pod IP from the
  node's CIDR, ``start_delay`` seconds later;
- completion: a pod annotated ``sim.gpuop.io/run-seconds`` Succeeds after that long;
- termination: a pod marked for deletion is confirmed gone (the registry's
  ``complete_pod_termination``) after its grace period, capped at ``termination_cap``
  seconds so that tests and demos stay fast.

:meth:`Kubelet.power_off` stops all of that and does what the node lifecycle controller
does to a silent node (at once rather than after its 40 s grace): every node condition
Unknown, the ``node.kubernetes.io/unreachable`` taints, and its pods not Ready.
:meth:`Kubelet.power_on` boots the machine with a new boot id, reports Ready, records the
kubelet's ``Rebooted`` event, and restarts every container of the pods it still has.

Fault injection: :meth:`Kubelet.fail_diagnostics` makes gpuop's validation pods on the node
(those of one image, or all) exit non-zero instead of 0, with the last log lines the
diagnostic printed as the container's termination message (as a real kubelet writes them
for ``terminationMessagePolicy: FallbackToLogsOnError``): a GPU that fails DCGM's
``dcgmi diag`` or a burn.
``cluster.py`` creates one kubelet per machine; it runs on a
:class:`~gpuop_sim.cluster.wakeups.Wakeup`.
"""

from __future__ import annotations

import random
from typing import Any

from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.store import Change
from gpuop_sim.cluster import heartbeats, machines, podstatus
from gpuop_sim.cluster.machines import GPU_RESOURCE, Machine
from gpuop_sim.cluster.scheduling import allocatable, gpus_requested
from gpuop_sim.cluster.stages import (
    NODE_HEARTBEAT,
    VALIDATION_POD_LABEL,
    Next,
    Timings,
    phase_of,
    stage_of,
)
from gpuop_sim.cluster.wakeups import Wakeup, unless_gone

Obj = dict[str, Any]


class Kubelet:
    """Runs the pods of one node and reports the node, while its machine is up."""

    def __init__(
        self,
        registry: Registry,
        machine: Machine,
        *,
        rng: random.Random,
        start_delay: float,
        termination_cap: float,
        heartbeat_interval: float,
    ) -> None:
        self.registry = registry
        self.machine = machine
        self.rng = rng
        self.timings = Timings(start_delay, termination_cap, heartbeat_interval)
        self.up = False
        self.wakeup = Wakeup(f"kubelet on {machine.name}", self.sync)
        self._booted = False
        self._next_heartbeat = 0.0
        self._admitted: set[str] = set()
        """Admitted pods (by uid) whose containers are not running yet."""
        self._restarting: set[str] = set()
        self._due: dict[str, tuple[str, float]] = {}
        """Pod uid -> the stage it is in and when that stage is due (loop time)."""
        self._pod_ips: dict[str, str] = {}
        self._diagnostic_fault: podstatus.Exit | None = None
        self._fault_image: str | None = None
        registry.store.observe(self._on_change)

    @property
    def name(self) -> str:
        return self.machine.name

    def close(self) -> None:
        self.up = False
        self.wakeup.close()

    def _on_change(self, change: Change) -> None:
        if change.resource != kinds.PODS.group_resource:
            return
        for obj in (change.object, change.previous):
            if obj is not None and (obj.get("spec") or {}).get("nodeName") == self.name:
                self.wakeup.soon()
                return

    # Power.

    def power_on(self) -> None:
        """Boot (a new boot id after the first), register Ready, restart the pods."""
        if self.up:
            return
        rebooted = self._booted
        if rebooted:
            self.machine.boot(self.rng)
        self._booted, self.up = True, True
        now = self.registry.clock.now()
        if self.registry.store.get(kinds.NODES.group_resource, "", self.name) is None:
            self.registry.create(kinds.NODES, "", machines.node_object(self.machine, now))
        else:
            heartbeats.post_node_status(self.registry, self.machine, reachable=True)
        heartbeats.renew_lease(self.registry, self.name)
        if rebooted:
            heartbeats.record_rebooted(self.registry, self.machine, self.rng)
            for pod in self._pods():
                uid = pod["metadata"]["uid"]
                if phase_of(pod) == "Running" and not _terminating(pod):
                    self._write_status(pod, podstatus.not_ready(pod, now, restarting=True))
                    self._admitted.add(uid)
                    self._restarting.add(uid)
        self._next_heartbeat = self.wakeup.now() + self._heartbeat_seconds()
        self.wakeup.soon()

    def power_off(self) -> None:
        """Stop: no heartbeats, no pod changes; the node and its pods go not Ready."""
        if not self.up:
            return
        self.up = False
        self._due.clear()
        self._admitted.clear()
        self._restarting.clear()
        heartbeats.post_node_status(self.registry, self.machine, reachable=False)
        now = self.registry.clock.now()
        for pod in self._pods():
            if phase_of(pod) == "Running":
                self._write_status(pod, podstatus.not_ready(pod, now))

    # Faults.

    def fail_diagnostics(
        self, exit_code: int = 1, log: str = "", *, image: str | None = None
    ) -> None:
        """From now on, validation pods (of `image`, or every one) exit `exit_code` with
        `log` as their last log lines; `exit_code` 0 heals the node."""
        self._diagnostic_fault = podstatus.Exit(exit_code, log) if exit_code else None
        self._fault_image = image

    def _faulty(self, pod: Obj) -> podstatus.Exit | None:
        fault = self._diagnostic_fault
        images = [c.get("image") for c in (pod.get("spec") or {}).get("containers") or []]
        if fault is None or not pod["metadata"].get("labels", {}).get(VALIDATION_POD_LABEL):
            return None
        return fault if self._fault_image is None or self._fault_image in images else None

    # The pass.

    def sync(self) -> None:
        """Do what is due: admit, then take every pod through its stage (`stages.py`), post a
        heartbeat; then ask to run again at the next deadline. ``now`` is loop time."""
        if not self.up:
            return
        now = self.wakeup.now()
        pods = self._pods()
        self._forget({pod["metadata"]["uid"] for pod in pods})
        self._admit(pods)
        deadlines = [self._next_heartbeat]
        for pod in pods:
            uid = pod["metadata"]["uid"]
            stage = stage_of(pod, uid in self._admitted)
            if stage is None:
                self._due.pop(uid, None)
                continue
            due = now + stage.delay.seconds(pod, self.timings)
            known = self._due.get(uid)
            if known is not None and known[0] == stage.name:
                due = min(known[1], due)
            self._due[uid] = (stage.name, due)
            if Wakeup.due(due, now):
                del self._due[uid]
                self._next(stage.next, pod)
            else:
                deadlines.append(due)
        if Wakeup.due(self._next_heartbeat, now):
            self._next_heartbeat = now + self._heartbeat_seconds()
            self._next(NODE_HEARTBEAT.next, self._node())
            deadlines.append(self._next_heartbeat)
        self.wakeup.at(min(deadlines))

    def _heartbeat_seconds(self) -> float:
        return NODE_HEARTBEAT.delay.seconds({"metadata": {}}, self.timings)

    def _next(self, step: Next, obj: Obj) -> None:
        """Do a stage's `next` to `obj` (a pod, or the node for a heartbeat)."""
        if step is Next.DELETE:
            with unless_gone():
                self.registry.complete_pod_termination(*_key(obj))
        elif step is Next.RUN:
            self._start(obj)
        elif step is Next.SUCCEED:
            fault = self._faulty(obj)
            now = self.registry.clock.now()
            ended = (
                podstatus.succeeded(obj, now)
                if fault is None
                else podstatus.failed(obj, now, fault)
            )
            self._write_status(obj, ended)
        else:
            heartbeats.post_node_status(self.registry, self.machine, reachable=True)
            heartbeats.renew_lease(self.registry, self.name)

    def _pods(self) -> list[Obj]:
        return [
            pod
            for pod in self.registry.store.view(kinds.PODS.group_resource)
            if (pod.get("spec") or {}).get("nodeName") == self.name
        ]

    def _forget(self, present: set[str]) -> None:
        for pending in (self._due, self._pod_ips):
            for uid in [uid for uid in pending if uid not in present]:
                del pending[uid]
        self._admitted &= present
        self._restarting &= present

    def _admit(self, pods: list[Obj]) -> None:
        """Admit new pods oldest first while their GPUs fit; refuse the others."""
        capacity = allocatable(self._node(), GPU_RESOURCE)
        admitted = [
            pod
            for pod in pods
            if phase_of(pod) == "Running"
            or (
                phase_of(pod) == "Pending"
                and (pod["metadata"]["uid"] in self._admitted or _terminating(pod))
            )
        ]
        used = sum(gpus_requested(pod) for pod in admitted)
        waiting = [
            pod
            for pod in pods
            if phase_of(pod) == "Pending"
            and not _terminating(pod)
            and pod["metadata"]["uid"] not in self._admitted
        ]
        for pod in sorted(waiting, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            wanted = gpus_requested(pod)
            if used + wanted > capacity:
                message = (
                    f"Pod was rejected: Node didn't have enough resource: {GPU_RESOURCE}, "
                    f"requested: {wanted}, used: {used}, capacity: {capacity}"
                )
                reason = f"OutOf{GPU_RESOURCE}"
                stamp = self.registry.clock.now()
                self._write_status(pod, podstatus.rejected(pod, reason, message, stamp))
                continue
            used += wanted
            self._admitted.add(pod["metadata"]["uid"])

    def _start(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        self._admitted.discard(uid)
        restarted = uid in self._restarting
        self._restarting.discard(uid)
        host_ip = self.machine.internal_ip
        if (pod.get("spec") or {}).get("hostNetwork"):
            pod_ip = host_ip
        else:
            pod_ip = self._pod_ips.get(uid) or self._allocate_ip(uid)
        started = self.registry.clock.now()
        status = podstatus.running(pod, host_ip, pod_ip, started, restarted=restarted)
        self._write_status(pod, status)

    def _allocate_ip(self, uid: str) -> str:
        taken = set(self._pod_ips.values())
        host = next((h for h in range(2, 255) if self.machine.pod_ip(h) not in taken), 255)
        self._pod_ips[uid] = self.machine.pod_ip(host)
        return self._pod_ips[uid]

    # Writes.

    def _node(self) -> Obj:
        return self.registry.store.get(kinds.NODES.group_resource, "", self.name) or {}

    def _write_status(self, pod: Obj, status: Obj) -> None:
        def write(obj: Obj) -> None:
            obj["status"] = status

        with unless_gone():
            self.registry.mutate(
                kinds.PODS, *_key(pod), write, subresource="status", validate=False
            )


def _terminating(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _key(pod: Obj) -> tuple[str, str]:
    return pod["metadata"]["namespace"], pod["metadata"]["name"]
