"""A minimal Job controller for the simulated cluster.

A Job runs ``parallelism`` pods at a time until ``completions`` of them have Succeeded
(the simulated kubelet completes pods annotated ``sim.gpuop.io/run-seconds``, which the
generated Jobs carry), then is ``Complete`` with reason ``CompletionsReached``; more
failed pods than ``backoffLimit`` make it ``Failed``. An evicted or deleted pod is
replaced while the Job still runs, as with ``podReplacementPolicy: TerminatingOrFailed``
once the pod is terminating. Which pods finished is remembered in memory, for the life of
the simulation, where upstream uses tracking finalizers.

Shared controller plumbing is in ``controllers.py``. ``cluster.py`` creates the
controller; it runs on a :class:`~gpuop_sim.cluster.wakeups.Wakeup`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from gpuop_sim.apiserver import kinds, pdb
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.timestamps import format_time
from gpuop_sim.cluster import controllers
from gpuop_sim.cluster.workload_kinds import JOBS

Obj = dict[str, Any]

_WATCHED = {kinds.PODS.group_resource, JOBS.group_resource}


class JobController(controllers.WorkloadController):
    """Runs each Job's pods until enough succeed, or too many fail."""

    def __init__(self, registry: Registry, rng: random.Random) -> None:
        super().__init__(registry, rng, "job controller", _WATCHED)
        self._succeeded: dict[str, set[str]] = defaultdict(set)
        self._failed: dict[str, set[str]] = defaultdict(set)

    def sync(self) -> None:
        owned = controllers.owned_pods(self.registry.store)
        for job in controllers.live(self.registry.store, JOBS):
            self._sync(job, owned.get(job["metadata"]["uid"], []))

    def _sync(self, job: Obj, pods: list[Obj]) -> None:
        uid, spec, old = job["metadata"]["uid"], job["spec"], job.get("status") or {}
        if any(c.get("type") in ("Complete", "Failed") for c in old.get("conditions") or []):
            return
        succeeded, failed = self._succeeded[uid], self._failed[uid]
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Succeeded":
                succeeded.add(pod["metadata"]["uid"])
            elif phase == "Failed":
                failed.add(pod["metadata"]["uid"])
        active = [pod for pod in pods if controllers.is_active(pod)]
        now = format_time(self.registry.clock.now())
        status: Obj = {"startTime": old.get("startTime", now), "uncountedTerminatedPods": {}}
        if len(succeeded) >= spec["completions"]:
            reached = "Reached expected number of succeeded pods"
            status["conditions"] = [
                controllers.condition(old, "Complete", "True", "CompletionsReached", reached, now)
            ]
            status["completionTime"] = now
        elif len(failed) > spec["backoffLimit"]:
            limit = "Job has reached the specified backoff limit"
            status["conditions"] = [
                controllers.condition(old, "Failed", "True", "BackoffLimitExceeded", limit, now)
            ]
        else:
            missing = min(spec["parallelism"], spec["completions"] - len(succeeded)) - len(active)
            for _ in range(missing):
                created = controllers.create_pod(self.registry, self.rng, job)
                if created is not None:
                    active.append(created)
        counts = {
            "active": len(active),
            "ready": sum(1 for pod in active if pdb.is_ready(pod)),
            "succeeded": len(succeeded),
            "failed": len(failed),
        }
        status.update({key: value for key, value in counts.items() if value or key == "ready"})
        controllers.write_status(self.registry, JOBS, job, status)
