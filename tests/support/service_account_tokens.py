"""Pods and pod-bound service-account tokens on the real control plane, for the NATS auth
callout's real-cluster tests."""

from __future__ import annotations

from typing import Any

from gpuop.kube.tokenreviews import AUDIENCE
from tests.support.control_plane import ControlPlane

SERVICE_ACCOUNT = "gpuop-driver-manager"


def agent_pod(plane: ControlPlane, namespace: str, node: str) -> dict[str, Any]:
    """A driver-manager pod bound to `node` (as its DaemonSet would place it)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"driver-manager-{node}"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "gpuop:test"}],
        },
    }
    made: dict[str, Any] = plane.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    return made


def token_for(
    plane: ControlPlane,
    namespace: str,
    *,
    pod: dict[str, Any] | None,
    audience: str = AUDIENCE,
    seconds: int = 600,
) -> str:
    """A TokenRequest for the ServiceAccount, bound to `pod` as the kubelet's projection is."""
    spec: dict[str, Any] = {"audiences": [audience], "expirationSeconds": seconds}
    if pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
    answer = plane.call(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{SERVICE_ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    token: str = answer["status"]["token"]
    return token
