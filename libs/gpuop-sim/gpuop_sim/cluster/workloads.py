"""The workloads a simulated GPU cluster runs, so that drains and upgrades meet real pods.

:func:`install` does, through the registry, what a cluster's owners would have done:

- the GPU Operator's labels on every GPU node (``nvidia.com/gpu.present`` and
  ``nvidia.com/gpu.deploy.driver``) and its driver DaemonSet ``nvidia-driver-daemonset``
  in ``gpu-operator``, selecting ``nvidia.com/gpu.deploy.driver=true`` so that operand
  gating by that label stops and starts it;
- a monitoring agent, DaemonSet ``node-exporter`` in ``monitoring``, on every node;
- GPU Deployments in ``ml-serving``: ``llm-inference`` (1 GPU per pod) under a
  ``maxUnavailable: 1`` PodDisruptionBudget, and ``embeddings`` (2 GPUs, an ``emptyDir``
  model cache) under ``minAvailable: 50%``; plus ``metrics-gateway``, CPU only;
- a GPU Job in ``ml-training``, ``finetune`` (4 GPUs per pod, an ``emptyDir`` for
  checkpoints), whose pods complete after ``job_seconds``.

GPU pods fill at most half of the cluster's GPUs (a workload that would not fit is left
out), so with two or more nodes any one node can be drained and its pods rescheduled.
Every budget allows one disruption once its pods are healthy. A one-node cluster gets no
budgets: its evicted pods have nowhere to go, so any budget would block every drain forever
(as it would for `kubectl drain` on such a cluster). The controllers
(``replication.py``, ``daemons.py``) make the pods; names come from the cluster's seeded
random, so a seed gives the same cluster every run. Called by ``cluster.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.resources import ResourceType
from gpuop_sim.cluster import podstatus
from gpuop_sim.cluster.machines import GPU_RESOURCE
from gpuop_sim.cluster.workload_kinds import DEPLOYMENTS, JOBS

Obj = dict[str, Any]

OPERATOR_NAMESPACE = "gpu-operator"
MONITORING_NAMESPACE = "monitoring"
SERVING_NAMESPACE = "ml-serving"
TRAINING_NAMESPACE = "ml-training"
DRIVER_DAEMONSET = "nvidia-driver-daemonset"
MONITORING_DAEMONSET = "node-exporter"
DRIVER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.driver"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_NODE_LABELS = {GPU_PRESENT_LABEL: "true", DRIVER_DEPLOY_LABEL: "true"}
"""What the GPU Operator's labels say on every GPU node."""


@dataclass(frozen=True)
class GpuWorkload:
    """One GPU workload the generator may install."""

    kind: str
    """``Deployment`` or ``Job``."""
    namespace: str
    name: str
    replicas: int
    gpus: int
    image: str
    scratch: str | None = None
    """The name of an ``emptyDir`` volume mounted at ``/scratch``, if any."""
    budget: tuple[str, int | str] | None = None
    """The PodDisruptionBudget over the pods: ``("minAvailable", "50%")`` and the like."""


def plan(nodes: int, gpus: int) -> list[GpuWorkload]:
    """The GPU workloads that fit in half of ``nodes`` x ``gpus``, in install order."""
    serving = "nvcr.io/nvidia/tritonserver:24.08-py3"
    candidates = [
        GpuWorkload(
            kind="Deployment",
            namespace=SERVING_NAMESPACE,
            name="llm-inference",
            replicas=max(2, nodes),
            gpus=1,
            image=serving,
            budget=("maxUnavailable", 1),
        ),
        GpuWorkload(
            kind="Deployment",
            namespace=SERVING_NAMESPACE,
            name="embeddings",
            replicas=max(2, nodes // 2),
            gpus=min(2, gpus),
            image=serving,
            scratch="model-cache",
            budget=("minAvailable", "50%"),
        ),
        GpuWorkload(
            kind="Job",
            namespace=TRAINING_NAMESPACE,
            name="finetune",
            replicas=max(1, nodes // 2),
            gpus=min(4, gpus),
            image="nvcr.io/nvidia/pytorch:24.08-py3",
            scratch="checkpoints",
        ),
    ]
    if nodes == 1:
        candidates = [replace(workload, budget=None) for workload in candidates]
    budget, chosen = nodes * gpus // 2, []
    for workload in candidates:
        needed = workload.replicas * workload.gpus
        if needed <= budget:
            chosen.append(workload)
            budget -= needed
    return chosen


def _template(labels: dict[str, str], container: Obj, **spec: Any) -> Obj:
    return {"metadata": {"labels": labels}, "spec": {"containers": [container], **spec}}


def _gpu_template(workload: GpuWorkload, job_seconds: float) -> Obj:
    limits = {GPU_RESOURCE: str(workload.gpus)}
    container: Obj = {
        "name": "main",
        "image": workload.image,
        "resources": {"requests": {"cpu": "4", "memory": "32Gi", **limits}, "limits": limits},
    }
    spec: Obj = {"terminationGracePeriodSeconds": 30}
    if workload.scratch:
        container["volumeMounts"] = [{"name": workload.scratch, "mountPath": "/scratch"}]
        spec["volumes"] = [{"name": workload.scratch, "emptyDir": {}}]
    template = _template({"app": workload.name}, container, **spec)
    if workload.kind == "Job":
        template["spec"]["restartPolicy"] = "Never"
        seconds = f"{job_seconds:g}"
        template["metadata"]["annotations"] = {podstatus.RUN_SECONDS_ANNOTATION: seconds}
    return template


def _daemonsets() -> list[tuple[str, Obj]]:
    driver = _template(
        {"app": DRIVER_DAEMONSET, "app.kubernetes.io/component": "nvidia-driver"},
        {
            "name": "nvidia-driver-ctr",
            "image": "nvcr.io/nvidia/driver:580.159.04-ubuntu24.04",
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "run-nvidia", "mountPath": "/run/nvidia"}],
        },
        nodeSelector={DRIVER_DEPLOY_LABEL: "true"},
        tolerations=[{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        priorityClassName="system-node-critical",
        hostPID=True,
        volumes=[{"name": "run-nvidia", "hostPath": {"path": "/run/nvidia"}}],
    )
    exporter = _template(
        {"app.kubernetes.io/name": MONITORING_DAEMONSET},
        {"name": "node-exporter", "image": "quay.io/prometheus/node-exporter:v1.8.2"},
        tolerations=[{"operator": "Exists"}],
        hostNetwork=True,
        hostPID=True,
    )
    return [
        (OPERATOR_NAMESPACE, _daemonset(DRIVER_DAEMONSET, driver)),
        (MONITORING_NAMESPACE, _daemonset(MONITORING_DAEMONSET, exporter)),
    ]


def _daemonset(name: str, template: Obj) -> Obj:
    selector = {"matchLabels": template["metadata"]["labels"]}
    return {"metadata": {"name": name}, "spec": {"selector": selector, "template": template}}


def _label_gpu_node(node: Obj) -> None:
    node["metadata"].setdefault("labels", {}).update(GPU_NODE_LABELS)


def _deployment(name: str, replicas: int, template: Obj) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        },
    }


def manifests(nodes: int, gpus: int, *, job_seconds: float) -> list[tuple[ResourceType, str, Obj]]:
    """The namespaces, DaemonSets, workloads and budgets of a cluster of ``nodes`` machines
    with ``gpus`` GPUs each, in create order: (resource type, namespace, object). What
    :func:`install` creates in the registry, and a real cluster's test fleet through its
    API server."""
    found: list[tuple[ResourceType, str, Obj]] = []
    namespaces = (OPERATOR_NAMESPACE, MONITORING_NAMESPACE, SERVING_NAMESPACE, TRAINING_NAMESPACE)
    for namespace in namespaces:
        found.append((kinds.NAMESPACES, "", {"metadata": {"name": namespace}}))
    for namespace, daemonset in _daemonsets():
        found.append((kinds.DAEMONSETS, namespace, daemonset))
    for workload in plan(nodes, gpus):
        template = _gpu_template(workload, job_seconds)
        if workload.kind == "Job":
            job = {
                "metadata": {"name": workload.name, "labels": {"app": workload.name}},
                "spec": {
                    "parallelism": workload.replicas,
                    "completions": workload.replicas,
                    "template": template,
                },
            }
            found.append((JOBS, workload.namespace, job))
            continue
        deployment = _deployment(workload.name, workload.replicas, template)
        found.append((DEPLOYMENTS, workload.namespace, deployment))
        if workload.budget is not None:
            field, value = workload.budget
            budget = {
                "metadata": {"name": workload.name},
                "spec": {"selector": deployment["spec"]["selector"], field: value},
            }
            found.append((kinds.PODDISRUPTIONBUDGETS, workload.namespace, budget))
    gateway = {
        "name": "gateway",
        "image": "registry.example/metrics-gateway:2.3.1",
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
    }
    template = _template({"app": "metrics-gateway"}, gateway)
    found.append((DEPLOYMENTS, SERVING_NAMESPACE, _deployment("metrics-gateway", 2, template)))
    return found


def install(registry: Registry, nodes: list[str], gpus: int, *, job_seconds: float) -> None:
    """Label the GPU nodes and create the namespaces, DaemonSets, workloads and budgets."""
    for name in nodes if gpus else []:
        registry.mutate(kinds.NODES, "", name, _label_gpu_node)
    for resource, namespace, obj in manifests(len(nodes), gpus, job_seconds=job_seconds):
        registry.create(resource, namespace, obj)
