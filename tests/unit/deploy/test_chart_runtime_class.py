"""The chart's RuntimeClass `nvidia`: it names the handler the runtime drop-ins add
(`gpuop.host.runtimes.HANDLER`), keeps its pods on GPU nodes, and can be left to an existing
one. Kubernetes validity is checked with every other manifest in test_chart.py."""

from __future__ import annotations

import kubernetes_validate

from gpuop.host import runtimes
from tests.support.charts import VALUES, render, render_with, values


def test_the_runtime_class_names_the_handler_the_drop_ins_add() -> None:
    for name in VALUES:
        runtime_class = render(name).get("RuntimeClass", "nvidia")
        assert runtime_class["apiVersion"] == "node.k8s.io/v1"
        assert runtime_class["handler"] == runtimes.HANDLER
        assert "namespace" not in runtime_class["metadata"]  # cluster-scoped


def test_the_runtime_class_keeps_its_pods_on_gpu_nodes() -> None:
    runtime_class = render("defaults").get("RuntimeClass", "nvidia")
    assert runtime_class["scheduling"] == {"nodeSelector": {"nvidia.com/gpu.present": "true"}}
    kubernetes_validate.validate(runtime_class, "1.27", strict=True)


def test_an_existing_runtime_class_is_left_alone_when_asked() -> None:
    overrides = values("defaults") or {}
    rendering = render_with({**overrides, "runtimeClass": {"create": False}})
    assert rendering.all("RuntimeClass") == []


def test_a_runtime_class_without_scheduling_renders_valid() -> None:
    rendering = render_with({"runtimeClass": {"nodeSelector": None}})
    runtime_class = rendering.get("RuntimeClass", "nvidia")
    assert "scheduling" not in runtime_class
    kubernetes_validate.validate(runtime_class, kubernetes_validate.latest_version(), strict=True)
