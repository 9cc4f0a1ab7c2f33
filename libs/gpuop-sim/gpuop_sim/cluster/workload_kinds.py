"""The workload resource types the simulated cluster serves beyond the API server's own.

``apps/v1`` Deployments and ReplicaSets and ``batch/v1`` Jobs, with the registry rules of
their upstream strategies that clients notice: defaults (``replicas: 1``, a Job's
``parallelism``, ``completions`` and ``backoffLimit``), a new object's status cleared, a
Job's generated selector and ``controller-uid``/``job-name`` labels, and validation (a
selector that matches the template's labels, an immutable selector, non-negative
replicas, a Job's ``restartPolicy``). ``cluster.py`` registers :data:`WORKLOADS` in the
server's catalog, so discovery lists them and kubectl can ``get deploy,rs,job``; the
controllers in ``replication.py`` keep their pods.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver.errors import FieldError
from gpuop_sim.apiserver.resources import Catalog, ResourceType
from gpuop_sim.apiserver.selectors import LabelSelector

Obj = dict[str, Any]

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def _clear_status(obj: Obj) -> None:
    obj.pop("status", None)


def _template_errors(spec: Obj, old: Obj | None, *, immutable_selector: bool) -> list[FieldError]:
    found: list[FieldError] = []
    selector = spec.get("selector")
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    parsed = LabelSelector.from_spec(selector)
    if parsed is None:
        found.append(FieldError.required("spec.selector", ""))
    elif not parsed.matches({"metadata": {"labels": labels}}):
        found.append(
            FieldError.invalid(
                "spec.template.metadata.labels",
                labels,
                "`selector` does not match template `labels`",
            )
        )
    if (
        immutable_selector
        and old is not None
        and selector != (old.get("spec") or {}).get("selector")
    ):
        found.append(FieldError.invalid("spec.selector", selector, "field is immutable"))
    containers = (template.get("spec") or {}).get("containers") or []
    if not containers:
        found.append(FieldError.required("spec.template.spec.containers", ""))
    for index, container in enumerate(containers):
        for key in ("name", "image"):
            if not container.get(key):
                found.append(
                    FieldError.required(f"spec.template.spec.containers[{index}].{key}", "")
                )
    return found


def _replicated_normalize(obj: Obj) -> None:
    obj.setdefault("spec", {}).setdefault("replicas", 1)


def _replicated_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found = _template_errors(spec, old, immutable_selector=True)
    if int(spec.get("replicas", 0)) < 0:
        found.append(
            FieldError.invalid(
                "spec.replicas", spec["replicas"], "must be greater than or equal to 0"
            )
        )
    return found


def _deployment_normalize(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault(
        "strategy",
        {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
    )
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)


def _job_create(obj: Obj) -> None:
    """Generate the selector and pod labels, as the Job strategy's PrepareForCreate."""
    obj.pop("status", None)
    metadata, spec = obj["metadata"], obj.setdefault("spec", {})
    if spec.get("manualSelector"):
        return
    uid, name = metadata["uid"], metadata.get("name", "")
    generated = {JOB_UID_LABEL: uid, JOB_NAME_LABEL: name, "controller-uid": uid, "job-name": name}
    template_metadata = spec.setdefault("template", {}).setdefault("metadata", {})
    template_metadata["labels"] = {**(template_metadata.get("labels") or {}), **generated}
    spec["selector"] = {"matchLabels": {JOB_UID_LABEL: uid}}


def _job_normalize(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)


def _job_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found = _template_errors(spec, old, immutable_selector=True)
    policy = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
    if policy not in ("OnFailure", "Never"):
        found.append(
            FieldError.not_supported(
                "spec.template.spec.restartPolicy", policy or "", ("OnFailure", "Never")
            )
        )
    return found


DEPLOYMENTS = ResourceType(
    "apps",
    "v1",
    "Deployment",
    "deployments",
    "deployment",
    namespaced=True,
    description="Deployment enables declarative updates for Pods and ReplicaSets.",
    short_names=("deploy",),
    categories=("all",),
    subresources=frozenset({"status"}),
    prepare_create=_clear_status,
    normalize=_deployment_normalize,
    validate=_replicated_validate,
)
REPLICASETS = ResourceType(
    "apps",
    "v1",
    "ReplicaSet",
    "replicasets",
    "replicaset",
    namespaced=True,
    description=(
        "ReplicaSet ensures that a specified number of pod replicas are running at any given time."
    ),
    short_names=("rs",),
    categories=("all",),
    subresources=frozenset({"status"}),
    prepare_create=_clear_status,
    normalize=_replicated_normalize,
    validate=_replicated_validate,
)
JOBS = ResourceType(
    "batch",
    "v1",
    "Job",
    "jobs",
    "job",
    namespaced=True,
    description="Job represents the configuration of a single job.",
    categories=("all",),
    subresources=frozenset({"status"}),
    prepare_create=_job_create,
    normalize=_job_normalize,
    validate=_job_validate,
)

WORKLOADS = (DEPLOYMENTS, REPLICASETS, JOBS)


def register(catalog: Catalog) -> None:
    for resource in WORKLOADS:
        catalog.register(resource)
