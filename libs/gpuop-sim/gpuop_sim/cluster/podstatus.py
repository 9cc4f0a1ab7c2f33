"""Pod status as a kubelet and the scheduler report it.

Pure functions from a pod (and the moment) to its next ``status``: scheduled or not
(:func:`set_condition` with ``PodScheduled``), rejected at admission, running with every
container started and ready, restarted after a reboot, completed, or not Ready because
its node went silent. The simulated scheduler (``scheduling.py``) and kubelet
(``kubelet.py``) write what these return through the ``status`` subresource; the
container ids and image digests are derived from the pod, so they are stable across runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuop_sim.apiserver.timestamps import format_time

Obj = dict[str, Any]

POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
RUN_SECONDS_ANNOTATION = "sim.gpuop.io/run-seconds"
KEPT = ("qosClass", "startTime", "resourceClaimStatuses")
"""Status fields a running pod keeps from before: the claims the scheduler recorded stay."""
"""A pod annotation the simulated kubelet honours: containers exit 0 after this many
seconds of running, so the pod Succeeds (how generated Jobs finish)."""


def set_condition(
    status: Obj,
    kind: str,
    value: str,
    now: datetime,
    *,
    reason: str | None = None,
    message: str | None = None,
) -> None:
    """Set one pod condition in place; its transition time moves only when it flips."""
    conditions: list[Obj] = status.setdefault("conditions", [])
    stamp = format_time(now)
    for condition in conditions:
        if condition.get("type") == kind:
            if condition.get("status") != value:
                condition["lastTransitionTime"] = stamp
            break
    else:
        condition = {"type": kind, "lastProbeTime": None, "lastTransitionTime": stamp}
        conditions.append(condition)
    condition["status"] = value
    for key, text in (("reason", reason), ("message", message)):
        if text is None:
            condition.pop(key, None)
        else:
            condition[key] = text


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _image_id(image: str) -> str:
    repository = image.rsplit(":", 1)[0] if ":" in image.rpartition("/")[2] else image
    return f"{repository}@sha256:{_digest(image)}"


def _container_status(pod: Obj, container: Obj, restarts: int, state: Obj, ready: bool) -> Obj:
    image = container.get("image", "")
    return {
        "name": container.get("name", ""),
        "image": image,
        "imageID": _image_id(image),
        "containerID": "containerd://"
        + _digest(pod["metadata"]["uid"], container.get("name", ""), str(restarts)),
        "ready": ready,
        "started": "running" in state,
        "restartCount": restarts,
        "state": state,
        "lastState": {},
    }


def restarts_of(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return max((int(s.get("restartCount", 0)) for s in statuses), default=0)


def running(pod: Obj, host_ip: str, pod_ip: str, now: datetime, *, restarted: bool) -> Obj:
    """Every container started and ready; after a reboot, one more restart each, the
    previous run ended by the power loss."""
    old = pod.get("status") or {}
    spec = pod.get("spec") or {}
    stamp = format_time(now)
    restarts = restarts_of(pod) + (1 if restarted else 0)
    status: Obj = {key: old[key] for key in KEPT if key in old}
    status["conditions"] = [dict(c) for c in old.get("conditions") or []]
    status.setdefault("startTime", stamp)
    for kind in (*POD_CONDITIONS, "PodScheduled"):
        set_condition(status, kind, "True", now)
    containers = []
    for container in spec.get("containers") or []:
        entry = _container_status(pod, container, restarts, {"running": {"startedAt": stamp}}, True)
        if restarted:
            entry["lastState"] = {
                "terminated": {"exitCode": 255, "reason": "Unknown", "finishedAt": stamp}
            }
        containers.append(entry)
    status["containerStatuses"] = containers
    if spec.get("initContainers"):
        done = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": stamp}}
        status["initContainerStatuses"] = [
            _container_status(pod, c, restarts, done, True) for c in spec["initContainers"]
        ]
    status.update(
        phase="Running",
        hostIP=host_ip,
        hostIPs=[{"ip": host_ip}],
        podIP=pod_ip,
        podIPs=[{"ip": pod_ip}],
    )
    return status


@dataclass(frozen=True)
class Exit:
    """How a container ends that does not exit 0: its code and its last log lines."""

    code: int
    log: str = ""


def succeeded(pod: Obj, now: datetime) -> Obj:
    """Every container exited 0: the pod completed and holds nothing any more."""
    return _ended(pod, now, "Succeeded", Exit(0))


def failed(pod: Obj, now: datetime, exit: Exit) -> Obj:
    """Every container exited `exit.code` (an error): the pod Failed, the last log lines
    its containers' termination message (`FallbackToLogsOnError`)."""
    return _ended(pod, now, "Failed", exit)


def _ended(pod: Obj, now: datetime, phase: str, exit: Exit) -> Obj:
    terminated: Obj = {"exitCode": exit.code, "reason": "Completed" if exit.code == 0 else "Error"}
    if exit.log:
        terminated["message"] = exit.log
    status: Obj = dict(pod.get("status") or {})
    stamp = format_time(now)
    status["conditions"] = [dict(c) for c in status.get("conditions") or []]
    for kind in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
        set_condition(status, kind, "False", now, reason="PodCompleted")
    status["containerStatuses"] = [
        {
            **entry,
            "ready": False,
            "started": False,
            "state": {
                "terminated": {
                    **terminated,
                    "startedAt": (entry.get("state") or {}).get("running", {}).get("startedAt"),
                    "finishedAt": stamp,
                }
            },
        }
        for entry in status.get("containerStatuses") or []
    ]
    status["phase"] = phase
    return status


def rejected(pod: Obj, reason: str, message: str, now: datetime) -> Obj:
    """Refused at admission, as a kubelet refuses a pod its node cannot hold."""
    old = pod.get("status") or {}
    status: Obj = {key: old[key] for key in ("qosClass",) if key in old}
    status["conditions"] = [dict(c) for c in old.get("conditions") or []]
    status.update(phase="Failed", reason=reason, message=message, startTime=format_time(now))
    return status


def not_ready(pod: Obj, now: datetime, *, restarting: bool = False) -> Obj:
    """Ready False: the node went silent, or the containers are starting again."""
    status: Obj = dict(pod.get("status") or {})
    status["conditions"] = [dict(c) for c in status.get("conditions") or []]
    set_condition(status, "Ready", "False", now)
    if restarting:
        set_condition(status, "ContainersReady", "False", now)
        status["containerStatuses"] = [
            {
                **entry,
                "ready": False,
                "started": False,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
            for entry in status.get("containerStatuses") or []
        ]
    return status
