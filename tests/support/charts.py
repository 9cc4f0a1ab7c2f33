"""The Helm chart, rendered and linted by Helm itself, offline.

No PyPI wheel ships the `helm` command; `helm-python-sdk` ships Helm v4's own Go SDK as a
shared library (the code `helm lint` and `helm template` run), which these tests call. Each
rendering is done once per values file and shared by the tests that read it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpuop"
VALUES = {
    "defaults": None,
    "all-features": CHART / "ci" / "all-features-values.yaml",
    "external-nats": CHART / "ci" / "external-nats-values.yaml",
    "nats-cluster": CHART / "ci" / "nats-cluster-values.yaml",
}
"""The values files every test renders with: none, every feature on, an existing NATS, the
bundled NATS as a cluster of three servers."""
RELEASE = "gpuop"
NAMESPACE = "gpuop-system"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Rendering:
    """What `helm template` would print, as objects, with the template each came from."""

    manifests: tuple[tuple[str, Manifest], ...]

    def all(self, kind: str | None = None) -> list[Manifest]:
        return [m for _, m in self.manifests if kind is None or m["kind"] == kind]

    def get(self, kind: str, name: str) -> Manifest:
        found = [m for m in self.all(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"{len(found)} {kind} named {name}"
        return found[0]

    def workloads(self) -> list[Manifest]:
        return [m for m in self.all() if m["kind"] in ("DaemonSet", "Deployment", "StatefulSet")]


def served_in(manifest: Manifest, version: str) -> bool:
    """Whether Kubernetes `version` serves the manifest's API: DRA's `resource.k8s.io/v1`
    from 1.34 on (the chart renders its DeviceClasses only where the cluster serves it)."""
    if manifest["apiVersion"] == "resource.k8s.io/v1":
        return tuple(int(part) for part in version.split(".")[:2]) >= (1, 34)
    return True


def values(name: str) -> dict[str, Any] | None:
    path = VALUES[name]
    if path is None:
        return None
    loaded: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded


def render_with(overrides: dict[str, Any] | None) -> Rendering:
    helm.disable_logging()
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(overrides, name=RELEASE, namespace=NAMESPACE, is_install=True)
    manifests = []
    for template, text in sorted(rendered.items()):
        if not template.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        for document in yaml.safe_load_all(text):
            if document:
                manifests.append((template, document))
    return Rendering(tuple(manifests))


@functools.cache
def render(name: str) -> Rendering:
    return render_with(values(name))


def crds() -> list[Manifest]:
    helm.disable_logging()
    with helm.Chart.load(CHART) as chart:
        return [yaml.safe_load(crd["data"]) for crd in chart.crds]


def crd_texts() -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return {crd["filename"]: crd["data"] for crd in chart.crds}


def lint(name: str) -> dict[str, Any]:
    helm.disable_logging()
    return helm.lint(CHART, values(name), strict=True, namespace=NAMESPACE)


NODE_AGENTS = ("discovery", "driver-manager", "device-plugin", "network-manager", "telemetry")


def containers(rendering: Rendering) -> list[tuple[Manifest, dict[str, Any]]]:
    return [
        (workload, container)
        for workload in rendering.workloads()
        for container in workload["spec"]["template"]["spec"]["containers"]
    ]


def gpuop_containers(rendering: Rendering) -> list[tuple[Manifest, dict[str, Any]]]:
    return [(w, c) for w, c in containers(rendering) if c.get("args", [""])[0] == "run"]


def gpuop_pods(rendering: Rendering) -> set[str]:
    """The workloads that run the gpuop image's own processes: every service, and the NATS
    auth callout (`nats-auth`) in callout mode."""
    return {
        w["metadata"]["name"]
        for w, c in containers(rendering)
        if c.get("args", [""])[0] in ("run", "nats-auth")
    }


STATIC_NATS = {"nats": {"auth": {"mode": "static"}}}
"""The bundled NATS with password users (accounts.conf) instead of the default callout."""


def nats_address(url: str) -> str:
    """host:port of a NATS URL, with or without a user in it (static or callout mode)."""
    return url.split("://", 1)[-1].rsplit("@", 1)[-1]


POD_IP = "10.1.2.3"
"""The stand-in pod IP of `environment`."""


def environment(container: dict[str, Any], *, node: str) -> dict[str, str]:
    """The container's environment as the kubelet makes it: downward API (`node`, and
    `POD_IP` for the pod's address), Secrets (a stand-in password), and `$(VAR)` references
    to variables defined before."""
    fields = {"spec.nodeName": node, "status.podIP": POD_IP}
    environ: dict[str, str] = {}
    for variable in container["env"]:
        if "value" in variable:
            value = re.sub(
                r"\$\((\w+)\)", lambda m: environ.get(m[1], m[0]), str(variable["value"])
            )
        elif "fieldRef" in variable["valueFrom"]:
            value = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            value = "p4ssw0rd"
        environ[variable["name"]] = value
    return environ


def image_user() -> int:
    dockerfile = (REPO / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+)", dockerfile, re.M)
    return int(user)
