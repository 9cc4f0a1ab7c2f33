"""What the chart's ServiceAccounts may never do, asked of the real RBAC authorizer by the
real-cluster chart tests (static and callout mode)."""

from __future__ import annotations

from tests.support import fleet

NS = fleet.RELEASE_NAMESPACE

NEVER = [
    ("get", "secrets", NS), ("list", "secrets", ""), ("create", "pods/exec", "ml-serving"),
    ("delete", "nodes", ""), ("update", "nodes", ""), ("create", "pods", "kube-system"),
    ("deletecollection", "pods", ""), ("patch", "leases.coordination.k8s.io", "kube-node-lease"),
    ("update", "gpuclusterpolicies.gpuop.io", ""),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", ""),
    ("get", "configmaps", "kube-system"), ("create", "serviceaccounts/token", NS),
]  # fmt: skip
"""What no ServiceAccount of the chart may do."""
