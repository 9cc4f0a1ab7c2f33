"""The validation ladder's pod: one pod requesting one GPU, run to its end on a cordoned
node, then deleted.

Called by the upgrade orchestrator's executor for `RunValidationPod`. The pod is bound to
the node by `spec.nodeName`, so no scheduler weighs the node's cordon; a kubelet admits a
bound pod whatever `unschedulable` says, but not one that does not tolerate the node's
NoSchedule/NoExecute taints, so it tolerates the cordon's taint and gpuop's own
(`DRIVER_NOT_READY_TAINT`, a node brought up). It never restarts: its phase ends
`Succeeded` (every container exited 0) or `Failed`. Its name derives from the action id,
so executing the action again after a crash finds the same pod (AlreadyExists) and waits
for it instead of starting a second one.

On a node serving its GPUs through DRA (`PodSpec.device_class`: the device-API switch's
validation, and the upgrade's and remediation's pod rung there) the pod asks no
`nvidia.com/gpu`: it holds a ResourceClaim for one device of that DeviceClass, created first
under the pod's name and deleted after it. A claim is allocated by the scheduler only, so
that pod is not bound by `nodeName` but pinned to the node by a required node affinity on
`metadata.name` (and tolerates the cordon, which the scheduler honours): only a device of
the node's own slice can satisfy it. A claim still unallocated at the timeout (no free
device in the node's slices, or no slice) is the timeout's reason, with the scheduler's.

The `preflight` rung's pod (`PodSpec.all_gpus`) holds every GPU of the node: as many
`nvidia.com/gpu` as the node's capacity counts (not its allocatable, which leaves out a GPU
the device plugin calls unhealthy: a diagnostic that skipped the GPU just reset would prove
nothing; the kubelet refuses the pod until every one is advertised again), or on a DRA node a
claim with `allocationMode: All` for every device of the node's slices. Its container's
`terminationMessagePolicy` is `FallbackToLogsOnError`, so a failing diagnostic's last log lines
are the kubelet's termination message, and the reason the rung fails with; a pod that never
starts fails at the timeout with what it was waiting for (`ErrImagePull`, ...).

Waiting reads the pod (`read_namespaced_pod`) on a backoff from `FIRST_POLL` to
`LAST_POLL` seconds: a few requests for a pod that runs for a second, one every few
seconds for one that runs a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
from dataclasses import dataclass, replace
from typing import Any

from gpuop.events.upgrade import DRIVER_NOT_READY_TAINT
from gpuop.kube import conditions, errors, nodes, pods
from gpuop.kube.client import Kube, Obj

LABEL = "gpuop.io/validation-pod"
"""Label of every validation pod; its value is the node's name (truncated to 63)."""
GPU = "nvidia.com/gpu"
CLAIM = "gpu"
"""The name of the pod's claim, and of its one request, on a DRA node."""
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
FIRST_POLL = 0.1
LAST_POLL = 2.0
ADMISSION_RETRY = 1.0
"""Seconds between a pod refused at admission and the next one."""


@dataclass(frozen=True)
class PodSpec:
    """What the policy says the pod runs (`upgradePolicy.validation.pod`)."""

    image: str
    command: tuple[str, ...]
    namespace: str
    runtime_class_name: str = ""
    device_class: str = ""
    """Empty: one `nvidia.com/gpu`; else a ResourceClaim for one device of this DeviceClass."""
    gpu_uuids: tuple[str, ...] = ()
    """With `device_class`: the claim asks these GPUs, by the `uuid` attribute NVIDIA's
    driver publishes, tolerating the quarantine's device taint; empty: any one device."""
    all_gpus: bool = False
    """Every GPU of the node (the `preflight` rung's diagnostic), not one."""
    gpus: int = 1
    """How many `nvidia.com/gpu` the pod requests without `device_class` (`run` counts
    them for `all_gpus`)."""


@dataclass(frozen=True)
class PodEnd:
    """How the pod ended: `Succeeded`, `Failed`, or `Timeout`, and in words."""

    pod: pods.PodRef
    phase: str
    message: str = ""

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"


def pod_name(node: str, action_id: str, attempt: int = 1) -> str:
    """`gpuop-validate-<node>-<8 hex of the action id>`, within a pod name's 253; `-<n>`
    after it for the n-th pod after admission refusals."""
    digest = hashlib.sha256(action_id.encode()).hexdigest()[:8]
    again = f"-{attempt}" if attempt > 1 else ""
    return f"gpuop-validate-{node[:200]}-{digest}{again}"


def manifest(node: str, name: str, spec: PodSpec) -> Obj:
    """The pod: one container requesting one GPU, bound to `node`, tolerating the cordon."""
    tolerations = [
        {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
        {"key": DRIVER_NOT_READY_TAINT, "operator": "Exists"},
        {"key": GPU, "operator": "Exists"},
    ]
    container: dict[str, Any] = {
        "name": "validator",
        "image": spec.image,
        "command": list(spec.command),
        "resources": {"limits": {GPU: str(spec.gpus)}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "tolerations": tolerations,
        "containers": [container],
    }
    if spec.device_class:
        del pod_spec["nodeName"]
        container["resources"] = {"claims": [{"name": CLAIM}]}
        pod_spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimName": name}]
        pin = {"key": "metadata.name", "operator": "In", "values": [node]}
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [pin]}]
                }
            }
        }
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": {LABEL: node[:63]}},
        "spec": pod_spec,
    }


def claim_manifest(node: str, name: str, spec: PodSpec) -> Obj:
    """The pod's ResourceClaim (`resource.k8s.io/v1`): one device of `spec.device_class`, or
    the GPUs `spec.gpu_uuids` names, quarantined or not."""
    request: dict[str, Any] = {
        "deviceClassName": spec.device_class, "allocationMode": "ExactCount", "count": 1,
    }  # fmt: skip
    if spec.all_gpus:  # the diagnostic: the reset GPUs too, through their quarantine taint
        del request["count"]
        request["allocationMode"] = "All"
    if spec.all_gpus or spec.gpu_uuids:
        request["tolerations"] = [
            {"key": conditions.GPU_UNHEALTHY_TAINT, "operator": "Exists", "effect": "NoSchedule"}
        ]
    if spec.gpu_uuids and not spec.all_gpus:
        named = ", ".join(f"'{uuid}'" for uuid in spec.gpu_uuids)
        expression = f"device.attributes['{spec.device_class}'].uuid in [{named}]"
        request["count"] = len(spec.gpu_uuids)
        request["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": {LABEL: node[:63]}},
        "spec": {"devices": {"requests": [{"name": CLAIM, "exactly": request}]}},
    }


def _exits(pod: Obj) -> str:
    """The containers' ends in words: `validator exited 1 (Error): <its termination
    message, the last log lines of a failed diagnostic>`."""
    ended = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated:
            reason = terminated.get("reason") or ""
            said = str(terminated.get("message") or "").strip()
            told = f": {said}" if said else ""
            ended.append(
                f"{status.get('name')} exited {terminated.get('exitCode')} ({reason}){told}"
            )
    status = pod.get("status") or {}
    words = [status.get("reason"), status.get("message"), *ended]
    return "; ".join(str(w) for w in words if w)


def _waiting(pod: Obj) -> str:
    """What a pod not started yet waits for: `validator waiting: ErrImagePull (...)`, or its
    phase."""
    waits = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting:
            message = f" ({waiting['message']})" if waiting.get("message") else ""
            waits.append(f"{status.get('name')} waiting: {waiting.get('reason')}{message}")
    return "; ".join(waits) or f"the pod was {pods.phase(pod) or 'Pending'}"


async def _gpu_count(kube: Kube, node: str) -> int:
    """Every GPU the node's device plugin registered (its capacity), at least one."""
    status = (await nodes.get(kube, node)).get("status") or {}
    counted = (status.get("capacity") or {}).get(GPU) or (status.get("allocatable") or {}).get(GPU)
    try:
        return max(1, int(counted or 1))
    except ValueError:
        return 1


async def run(kube: Kube, node: str, action_id: str, spec: PodSpec, timeout: float) -> PodEnd:
    """Run the validation pod on `node` to its end or `timeout`, then delete it. Raises
    `errors.KubeError` when the API server refused the create or could not be reached.

    A pod the kubelet refuses at admission for want of a GPU (`OutOfnvidia.com/gpu`) is
    tried again, as a new pod, until the timeout: the device plugin, resumed a moment ago,
    may not have advertised the GPUs again yet. Its last refusal is the timeout's reason."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    refused = ""
    if spec.all_gpus and not spec.device_class:
        spec = replace(spec, gpus=await _gpu_count(kube, node))
    for attempt in itertools.count(1):
        ref = pods.PodRef(spec.namespace, pod_name(node, action_id, attempt))
        unallocated: list[str] = []
        seen: list[Obj] = []
        try:
            end = await asyncio.wait_for(
                _one(kube, node, ref, spec, unallocated, seen), deadline - loop.time()
            )
        except TimeoutError:
            said = unallocated or ([refused] if refused else []) or [_waiting(p) for p in seen]
            why = f": {'; '.join(said)}" if said else ""
            return PodEnd(ref, "Timeout", f"not Succeeded within {timeout:g} s{why}")
        if not _refused_at_admission(end):
            return end
        refused = end.message
        await asyncio.sleep(min(ADMISSION_RETRY, max(0.0, deadline - loop.time())))
    raise AssertionError("unreachable")


async def _one(
    kube: Kube,
    node: str,
    ref: pods.PodRef,
    spec: PodSpec,
    unallocated: list[str],
    seen: list[Obj],
) -> PodEnd:
    """Run one pod (and its claim) to its end; deleted after, however it ended. Before the
    claim is deleted, why it was never allocated, if it was not, goes into `unallocated`;
    the pod as last read goes into `seen`."""
    body = manifest(node, ref.name, spec)
    if spec.device_class:
        claim = claim_manifest(node, ref.name, spec)
        with contextlib.suppress(errors.AlreadyExists):
            await kube.call(kube.resource.create_namespaced_resource_claim, spec.namespace, claim)
    with contextlib.suppress(errors.AlreadyExists):  # created before a crash: wait for it
        await kube.call(kube.core.create_namespaced_pod, spec.namespace, body)
    end: PodEnd | None = None
    try:
        end = await _ended(kube, ref, seen)
        return end
    finally:
        if spec.device_class and end is None:  # cut off at the timeout: say why, if it was
            with contextlib.suppress(errors.KubeError):
                unallocated += await _never_allocated(kube, node, ref, spec.device_class)
        # a pod left behind holds a GPU of a node about to be uncordoned; the client retries
        # a delete it may; one that still fails must not turn the pod's verdict into an error
        with contextlib.suppress(errors.KubeError):
            await pods.delete(kube, ref, grace_period_seconds=0)
        if spec.device_class:
            with contextlib.suppress(errors.KubeError):
                delete = kube.resource.delete_namespaced_resource_claim
                await kube.call(delete, ref.name, ref.namespace)


async def _never_allocated(kube: Kube, node: str, ref: pods.PodRef, device_class: str) -> list[str]:
    """Why the pod's claim has no allocation, with the scheduler's word on the pod; empty
    when it has one."""
    claim = await kube.call(kube.resource.read_namespaced_resource_claim, ref.name, ref.namespace)
    if ((claim.get("status") or {}).get("allocation")) is not None:
        return []
    pod = await kube.call(kube.core.read_namespaced_pod, ref.name, ref.namespace)
    scheduled = [
        condition.get("message") or condition.get("reason") or ""
        for condition in (pod.get("status") or {}).get("conditions") or []
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False"
    ]
    said = f" (the scheduler: {scheduled[0]})" if scheduled and scheduled[0] else ""
    return [
        f"its ResourceClaim {ref.namespace}/{ref.name} was never allocated: no free "
        f"{device_class} device in the slices of {node}{said}"
    ]


def _refused_at_admission(end: PodEnd) -> bool:
    return end.phase == "Failed" and end.message.startswith(f"OutOf{GPU}")


async def _ended(kube: Kube, ref: pods.PodRef, seen: list[Obj]) -> PodEnd:
    delay = FIRST_POLL
    while True:
        pod = await kube.call(kube.core.read_namespaced_pod, ref.name, ref.namespace)
        seen[:] = [pod]
        if pods.is_finished(pod):
            return PodEnd(ref, pods.phase(pod), _exits(pod))
        await asyncio.sleep(delay)
        delay = min(delay * 2, LAST_POLL)
