"""The chart installed by the real Helm into the real control plane, every object accepted,
then each ServiceAccount's permissions asked of the real RBAC authorizer (SubjectAccessReview):
what each role's code calls must be allowed, and a set nobody needs must not be."""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import nkeys
from gpuop.kube import client, conditions, errors, nodes, validationpods
from tests.support import fleet
from tests.support.chart_access import NEVER
from tests.support.control_plane import ControlPlane

pytestmark = [pytest.mark.real_cluster]

NS = fleet.RELEASE_NAMESPACE
MUST = {
    "upgrade-orchestrator": [
        ("get", "nodes", ""), ("list", "nodes", ""), ("watch", "nodes", ""),
        ("patch", "nodes", ""), ("patch", "nodes/status", ""),
        ("list", "pods", ""), ("watch", "pods", ""),
        ("delete", "pods", "ml-serving"), ("create", "pods/eviction", "ml-serving"),
        ("list", "poddisruptionbudgets.policy", ""),
        ("get", "resourceclaims.resource.k8s.io", "ml-serving"),
        ("watch", "gpuclusterpolicies.gpuop.io", ""),
        ("patch", "gpuclusterpolicies/status.gpuop.io", ""),
        ("create", "leases.coordination.k8s.io", NS), ("create", "events", "default"),
    ],
    "discovery-cluster": [
        ("list", "nodes", ""), ("watch", "nodes", ""), ("patch", "nodes", ""),
        ("create", "events", "default"),
    ],
    "network-manager-cluster": [
        ("watch", "gpuclusterpolicies.gpuop.io", ""),
        ("create", "network-attachment-definitions.k8s.cni.cncf.io", "ml-serving"),
        ("delete", "network-attachment-definitions.k8s.cni.cncf.io", "ml-serving"),
    ],
    "device-plugin-cluster": [
        ("create", "resourceslices.resource.k8s.io", ""),
        ("update", "resourceslices.resource.k8s.io", ""),
        ("delete", "resourceslices.resource.k8s.io", ""),
        ("watch", "resourceslices.resource.k8s.io", ""),
        ("watch", "resourceclaims.resource.k8s.io", ""),
        ("get", "nodes", ""),
    ],
    "telemetry-cluster": [],
    "node-agent": [],
    # callout mode, the default: each node agent service under a ServiceAccount of its own
    "discovery": [], "driver-manager": [], "device-plugin": [], "network-manager": [],
    "telemetry": [],
}  # fmt: skip
"""Role -> (verb, resource, namespace) its code calls."""


TAINT = "gpuop.io/gpu-unhealthy"
GPU_HEALTHY = {
    "status": {
        "conditions": [
            {"type": "GPUHealthy", "status": "False", "reason": "GPUUnhealthy", "message": "x"}
        ]
    }
}
ISSUER = f"/api/v1/namespaces/{NS}/secrets/{fleet.RELEASE}-nats-issuer"
"""The callout's issuer key, which the chart generates (callout mode, the default)."""


NODE = "gpu-node-1"
PROBE = "example.com/gpuop-policy-probe"
"""A label and an extended resource no node writer may set: what each policy's probe writes."""
PROBE_ROUNDS = 240
"""Probes of each policy, half a second apart, before the wait gives up."""


def _probes(n: int) -> dict[str, tuple[str, list[str], str | None]]:
    """Policy -> (role, kubectl arguments, stdin): the n-th write the policy must refuse, with
    a value of its own, for a patch that changes nothing reaches no admission."""
    label = ["label", "node", NODE, f"{PROBE}=p{n}", "--overwrite"]
    capacity = {"status": {"capacity": {PROBE: str(n)}}}
    status = ["patch", "node", NODE, "--subresource=status", "--type=merge", "-p"]
    pod = _with(_validation_pod(f"gpuop-policy-probe-{n}"), hostNetwork=True)
    return {
        "node-writes (discovery-cluster)": ("discovery-cluster", label, None),
        "node-writes (upgrade-orchestrator)": ("upgrade-orchestrator", label, None),
        "node-status-writes": ("upgrade-orchestrator", [*status, json.dumps(capacity)], None),
        "pod-creates": ("upgrade-orchestrator", ["create", "-f", "-"], json.dumps(pod)),
    }


def _undo_probes(plane: ControlPlane, n: int) -> None:
    merge = {"content_type": "application/merge-patch+json"}
    node = f"/api/v1/nodes/{NODE}"
    plane.call("PATCH", node, {"metadata": {"labels": {PROBE: None}}}, **merge)
    plane.call("PATCH", f"{node}/status", {"status": {"capacity": {PROBE: None}}}, **merge)
    plane.request(f"/api/v1/namespaces/{NS}/pods/gpuop-policy-probe-{n}", method="DELETE")


def wait_for_policies(plane: ControlPlane, work: Path) -> float:
    """Seconds until each of the chart's admission policies refuses its probe write, undoing
    every probe that got through. The apiserver loads a new policy a moment after its
    creation (docs/security.md gives the window): a write before that goes through."""
    kubeconfigs = {
        role: fleet.service_account_kubeconfig(plane, role, work / f"{role}.kubeconfig")
        for role in ("discovery-cluster", "upgrade-orchestrator")
    }
    started = time.monotonic()
    waiting = set(_probes(0))
    for n in range(PROBE_ROUNDS):
        for policy, (role, command, stdin) in _probes(n).items():
            if policy not in waiting:
                continue
            done = fleet.kubectl_as(kubeconfigs[role], *command, stdin=stdin)
            if done.returncode != 0 and "ValidatingAdmissionPolicy" in done.stderr:
                waiting.discard(policy)
            elif done.returncode != 0:
                raise AssertionError(f"probe of {policy} failed otherwise: {done.stderr}")
        _undo_probes(plane, n)
        if not waiting:
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"policies not in force after {PROBE_ROUNDS} probes: {sorted(waiting)}")


@pytest.fixture(scope="module")
def installed(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart installed, and each of its admission policies in force."""
    manifest = fleet.install_chart(plane)
    window = wait_for_policies(plane, tmp_path_factory.mktemp("policy-probes"))
    print(f"\nthe chart's admission policies were in force {window:.1f} s after its install")
    yield manifest
    fleet.helm(plane, "uninstall", fleet.RELEASE, "--namespace", NS)
    # kept by the uninstall (helm.sh/resource-policy: keep), as a release's key must be
    plane.request(ISSUER, method="DELETE")


def test_the_generated_issuer_key_is_kept_across_an_upgrade(
    plane: ControlPlane, installed: str
) -> None:
    before = plane.call("GET", ISSUER)["data"]["key.pem"]
    # an Ed25519 PEM that the callout reads as its account key
    key = nkeys.KeyPair.from_pem(base64.b64decode(before).decode("ascii"), nkeys.Kind.ACCOUNT)
    fleet.helm(
        plane, "upgrade", fleet.RELEASE, str(fleet.CHART), "--namespace", NS, "--reuse-values"
    )
    after = plane.call("GET", ISSUER)["data"]["key.pem"]
    assert after == before, "the upgrade generated a new issuer key"
    assert key.public_key.startswith("A")


def test_every_object_of_the_chart_is_accepted_by_the_real_apiserver(
    plane: ControlPlane, installed: str
) -> None:
    found = fleet.kubectl(plane, "get", "-f", "-", "-o", "json", stdin=installed)
    assert found.returncode == 0, found.stderr
    kinds = sorted({item["kind"] for item in json.loads(found.stdout)["items"]})
    count = installed.count("\nkind: ") + installed.startswith("kind: ")
    assert len(json.loads(found.stdout)["items"]) == count, kinds
    for kind in ("ClusterRole", "DaemonSet", "Deployment", "NetworkPolicy", "ServiceAccount"):
        assert kind in kinds, kinds


def test_each_service_account_has_what_it_calls_and_nothing_it_must_not(
    plane: ControlPlane, installed: str
) -> None:
    rows, wrong = [], []
    for role, needed in MUST.items():
        for verb, resource, namespace in needed:
            answer = fleet.allowed(plane, role, verb, resource, namespace)
            rows.append((role, verb, resource, namespace or "*", "must", answer))
            if not answer:
                wrong.append(f"{role} may not {verb} {resource} in {namespace or 'any namespace'}")
        for verb, resource, namespace in NEVER:
            answer = fleet.allowed(plane, role, verb, resource, namespace)
            rows.append((role, verb, resource, namespace or "*", "never", answer))
            if answer:
                wrong.append(f"{role} may {verb} {resource} in {namespace or 'any namespace'}")
    print("\nrole | verb | resource | namespace | expected | allowed")
    for row in rows:
        print(" | ".join(str(cell) for cell in row))
    assert not wrong, "\n".join(wrong)


WRITES = [
    ("discovery-cluster", {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}}, None),
    ("discovery-cluster", {"metadata": {"annotations": {"gpuop.io/discovery-labels": "x"}}}, None),
    (
        "discovery-cluster",
        {"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}},
        "discovery-cluster may change node labels under nvidia.com/, "
        "feature.node.kubernetes.io/ only, not kubernetes.io/hostname",
    ),
    (
        "discovery-cluster",
        {"spec": {"unschedulable": True}},
        "discovery-cluster may not change a node's spec",
    ),
    ("upgrade-orchestrator", {"spec": {"unschedulable": True}}, None),
    ("upgrade-orchestrator", {"spec": {"unschedulable": None}}, None),
    ("upgrade-orchestrator", {"metadata": {"labels": {"gpuop.io/upgrade-state": "x"}}}, None),
    (
        "upgrade-orchestrator",
        {"spec": {"taints": [{"key": "x", "value": "y", "effect": "NoSchedule"}]}},
        "upgrade-orchestrator may change spec.unschedulable (cordon) and its taint "
        "gpuop.io/gpu-unhealthy of a node, nothing else",
    ),
    (
        "upgrade-orchestrator",
        {"metadata": {"labels": {"topology.kubernetes.io/zone": "other"}}},
        "not topology.kubernetes.io/zone",
    ),
    (
        "upgrade-orchestrator",
        {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "5"}}},
        "may change node annotations under gpuop.io/, nvidia.com/ only",
    ),
]
"""(role, merge patch of a node, None where allowed, else part of the refusal)."""


@pytest.fixture
def restored_node(plane: ControlPlane) -> Iterator[str]:
    """gpu-node-1, given back its labels, annotations, cordon and taints after the test."""
    path = f"/api/v1/nodes/{NODE}"
    before = plane.call("GET", path)
    yield NODE
    after = plane.call("GET", path)
    patch: dict[str, Any] = {"metadata": {}, "spec": {}}
    for field in ("labels", "annotations"):
        old, new = before["metadata"].get(field, {}), after["metadata"].get(field, {})
        patch["metadata"][field] = {**dict.fromkeys(set(new) - set(old)), **old}
    for field in ("unschedulable", "taints"):
        patch["spec"][field] = before["spec"].get(field)
    restored = plane.call("PATCH", path, patch, content_type="application/merge-patch+json")
    assert restored["metadata"].get("labels") == before["metadata"].get("labels")
    assert restored["spec"].get("taints") == before["spec"].get("taints")


@pytest.mark.security
@pytest.mark.parametrize(("role", "patch", "refusal"), WRITES)
def test_admission_policies_keep_each_node_writer_to_its_own_fields(
    plane: ControlPlane,
    installed: str,
    restored_node: str,
    tmp_path: Path,
    role: str,
    patch: dict[str, object],
    refusal: str | None,
) -> None:
    """RBAC's `patch nodes` allows any field; the chart's ValidatingAdmissionPolicies narrow
    it to what each role's code writes, and the real apiserver enforces them."""
    kubeconfig = fleet.service_account_kubeconfig(plane, role, tmp_path / f"{role}.kubeconfig")
    command = ["patch", "node", restored_node, "--type=merge", "-p", json.dumps(patch)]

    # one attempt: `installed` waited until every policy was in force
    done = fleet.kubectl_as(kubeconfig, *command)
    print(f"\n{role} patches {restored_node} with {json.dumps(patch)}: "
          f"{'allowed' if done.returncode == 0 else done.stderr.strip()}")  # fmt: skip
    if refusal is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0, done.stdout
        assert "ValidatingAdmissionPolicy" in done.stderr, done.stderr
        assert refusal in done.stderr, done.stderr


@pytest.mark.security
def test_a_policy_made_a_moment_ago_refuses_writes_once_its_probe_is_refused(
    plane: ControlPlane, installed: str, restored_node: str, tmp_path: Path
) -> None:
    """The window after a policy's creation, shown: discovery-cluster's node-writes policy
    deleted (until the apiserver lets the write through) and made again, a write at once
    may still go through (the apiserver compiles policies once a second); once the policy
    has refused its probe, the same write is refused."""
    role = "discovery-cluster"
    kubeconfig = fleet.service_account_kubeconfig(plane, role, tmp_path / f"{role}.kubeconfig")
    base, name = "/apis/admissionregistration.k8s.io/v1", f"{fleet.RELEASE}-{role}-node-writes"
    kinds = ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
    made = {kind: plane.call("GET", f"{base}/{kind}/{name}") for kind in kinds}

    def hostname(value: str) -> str:
        label = f"kubernetes.io/hostname={value}"
        done = fleet.kubectl_as(kubeconfig, "label", "node", restored_node, label, "--overwrite")
        return "allowed" if done.returncode == 0 else done.stderr.strip()

    for kind in kinds:
        plane.call("DELETE", f"{base}/{kind}/{name}")
    for n in range(PROBE_ROUNDS):  # until the apiserver has dropped the policy too
        if hostname(f"gone-{n}") == "allowed":
            break
        time.sleep(0.5)
    for kind, obj in made.items():
        # as Helm made it (its labels and annotations: the release's to uninstall)
        kept = {key: obj["metadata"][key] for key in ("name", "labels", "annotations")}
        fresh = {key: obj[key] for key in ("apiVersion", "kind", "spec")}
        plane.call("POST", f"{base}/{kind}", {**fresh, "metadata": kept})
    at_once = hostname("elsewhere")
    window = wait_for_policies(plane, tmp_path)
    after = hostname("elsewhere-again")
    print(f"\n{role} relabels {restored_node}'s hostname as its policy is made again: {at_once}")
    print(f"the policy in force {window:.1f} s later; then: {after}")
    assert "ValidatingAdmissionPolicy" in after, after


HEALTH_WRITES = [
    ("upgrade-orchestrator", ["taint", "node", "gpu-node-1", f"{TAINT}=:NoSchedule"], None),
    ("upgrade-orchestrator", ["taint", "node", "gpu-node-1", f"{TAINT}-"], None),
    (
        "upgrade-orchestrator",
        ["taint", "node", "gpu-node-1", "example.com/other=x:NoSchedule"],
        "may change spec.unschedulable (cordon) and its taint gpuop.io/gpu-unhealthy",
    ),
    ("upgrade-orchestrator", ["patch", "node", "gpu-node-1", "--subresource=status",
                              "--type=strategic", "-p", json.dumps(GPU_HEALTHY)], None),
    (
        "upgrade-orchestrator",
        ["patch", "node", "gpu-node-1", "--subresource=status", "--type=strategic", "-p",
         json.dumps({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})],
        "may change the GPUHealthy condition of a node's status, nothing else",
    ),
    (
        "upgrade-orchestrator",
        ["patch", "node", "gpu-node-1", "--subresource=status", "--type=merge", "-p",
         json.dumps({"status": {"capacity": {"nvidia.com/gpu": "99"}}})],
        "may change the GPUHealthy condition of a node's status, nothing else",
    ),
    (
        "discovery-cluster",
        ["patch", "node", "gpu-node-1", "--subresource=status", "--type=strategic", "-p",
         json.dumps(GPU_HEALTHY)],
        'cannot get resource "nodes/status"',  # nor patch it: kubectl reads it first
    ),
]  # fmt: skip
"""(role, kubectl arguments, None where allowed, else part of the refusal): the GPU health
signals the orchestrator writes (gpuop.kube.conditions) and nothing beside them."""


@pytest.mark.security
@pytest.mark.parametrize(("role", "command", "refusal"), HEALTH_WRITES)
def test_the_orchestrator_writes_its_health_condition_and_taint_and_nothing_else(
    plane: ControlPlane,
    installed: str,
    tmp_path: Path,
    role: str,
    command: list[str],
    refusal: str | None,
) -> None:
    kubeconfig = fleet.service_account_kubeconfig(plane, role, tmp_path / f"{role}.kubeconfig")
    done = fleet.kubectl_as(kubeconfig, *command)  # `installed` waited for the policies
    if refusal is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0, done.stdout
        assert refusal in done.stderr, done.stderr


@pytest.mark.security
async def test_gpuops_own_health_writes_pass_the_orchestrators_policies(
    plane: ControlPlane, installed: str, tmp_path: Path
) -> None:
    """The requests gpuop.kube.conditions makes (patches with the read resourceVersion, the
    status through its subresource), as the orchestrator's ServiceAccount: its own taint and
    condition pass RBAC and admission, another taint does not."""
    role = "upgrade-orchestrator"
    kubeconfig = fleet.service_account_kubeconfig(plane, role, tmp_path / f"{role}.kubeconfig")
    async with await client.connect(kubeconfig) as kube:
        await conditions.add_taint(kube, "gpu-node-1", TAINT, "xid-79", "NoSchedule")
        await conditions.set_node_condition(
            kube, "gpu-node-1", conditions.GPU_HEALTHY_CONDITION,
            *conditions.gpu_healthy_condition({"GPU-1": (79,)}),
        )  # fmt: skip
        sick = await nodes.get(kube, "gpu-node-1")
        await conditions.set_node_condition(
            kube, "gpu-node-1", "GPUHealthy", *conditions.gpu_healthy_condition({})
        )
        await conditions.remove_taint(kube, "gpu-node-1", TAINT)
        well = await nodes.get(kube, "gpu-node-1")
        with pytest.raises(errors.KubeError, match="ValidatingAdmissionPolicy"):
            await conditions.add_taint(kube, "gpu-node-1", "example.com/other", "", "NoSchedule")

    assert {"key": TAINT, "value": "xid-79", "effect": "NoSchedule"} in nodes.taints_of(sick)
    assert conditions.condition_of(sick, "GPUHealthy")["status"] == "False"  # type: ignore[index]
    assert all(t["key"] != TAINT for t in nodes.taints_of(well))
    assert conditions.condition_of(well, "GPUHealthy")["status"] == "True"  # type: ignore[index]


def test_the_lease_is_the_orchestrators_only_by_name(plane: ControlPlane, installed: str) -> None:
    lease = "leases.coordination.k8s.io"
    role = "upgrade-orchestrator"
    assert fleet.allowed(plane, role, "patch", lease, NS, "gpuop-upgrade-orchestrator")
    assert not fleet.allowed(plane, role, "patch", lease, NS, "someone-elses-lease")
    assert not fleet.allowed(
        plane, "discovery-cluster", "patch", lease, NS, "gpuop-upgrade-orchestrator"
    )


def _validation_pod(name: str) -> dict[str, Any]:
    spec = validationpods.PodSpec(image="busybox", command=("true",), namespace=NS)
    return validationpods.manifest("gpu-node-1", name, spec)


def _with(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    changed["spec"].update(spec)
    return changed


def _container_with(pod: dict[str, Any], **container: Any) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    changed["spec"]["containers"][0].update(container)
    return changed


ISSUER_SECRET, USERS_SECRET = f"{fleet.RELEASE}-nats-issuer", f"{fleet.RELEASE}-nats-users"
POD_CREATES = [
    ("its validation pod", lambda pod: pod, None),
    (
        "the issuer key as a volume",
        lambda pod: _with(pod, volumes=[{"name": "k", "secret": {"secretName": ISSUER_SECRET}}]),
        "no volume but their ServiceAccount token",
    ),
    (
        "the issuer key in a projected volume",
        lambda pod: _with(pod, volumes=[{"name": "k", "projected": {
            "sources": [{"secret": {"name": ISSUER_SECRET}}]}}]),
        "no volume but their ServiceAccount token",
    ),
    (
        "the NATS passwords as environment",
        lambda pod: _container_with(pod, envFrom=[{"secretRef": {"name": USERS_SECRET}}]),
        "take nothing from a Secret",
    ),
    (
        "the issuer key as one variable",
        lambda pod: _container_with(pod, env=[{"name": "K", "valueFrom": {
            "secretKeyRef": {"name": ISSUER_SECRET, "key": "key.pem"}}}]),
        "take nothing from a Secret",
    ),
    (
        "the callout's ServiceAccount",
        lambda pod: _with(pod, serviceAccountName=fleet.service_account("nats-auth")),
        "default ServiceAccount only",
    ),
    (
        "the node's root",
        lambda pod: _with(pod, volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
        "no volume but their ServiceAccount token",
    ),
    (
        "a privileged container",
        lambda pod: _container_with(pod, securityContext={"privileged": True}),
        "no host namespace, privilege or added capability",
    ),
    ("the node's network", lambda pod: _with(pod, hostNetwork=True), "no host namespace"),
    (
        "a port on the node's address",
        lambda pod: _container_with(pod, ports=[{"containerPort": 8080, "hostPort": 8080}]),
        "no host port",
    ),
    (
        "an unmasked /proc",
        lambda pod: _with(  # an unmasked /proc is valid in a user namespace only
            _container_with(pod, securityContext={"procMount": "Unmasked"}), hostUsers=False),
        "the default /proc mount only",
    ),
    (
        "no seccomp filter (pod)",
        lambda pod: _with(pod, securityContext={"seccompProfile": {"type": "Unconfined"}}),
        "no unconfined seccomp profile",
    ),
    (
        "no seccomp filter (container)",
        lambda pod: _container_with(
            pod, securityContext={"seccompProfile": {"type": "Unconfined"}}),
        "no unconfined seccomp profile",
    ),
]  # fmt: skip
"""(what the pod takes, how it differs from a validation pod, None where it may be created,
else part of the refusal)."""


@pytest.mark.security
@pytest.mark.parametrize(
    ("what", "change", "refusal"), POD_CREATES, ids=[p[0] for p in POD_CREATES]
)
def test_the_orchestrator_creates_validation_pods_and_no_pod_that_reads_a_secret(
    plane: ControlPlane,
    installed: str,
    tmp_path: Path,
    what: str,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    refusal: str | None,
) -> None:
    """`create pods` in the release namespace is the orchestrator's for its validation pod
    (gpuop.kube.validationpods); the chart's admission policy refuses every other pod, which
    could read the issuer key (and sign NATS users of any role), the NATS passwords, act as
    another ServiceAccount or reach a node's root."""
    role = "upgrade-orchestrator"
    kubeconfig = fleet.service_account_kubeconfig(plane, role, tmp_path / f"{role}.kubeconfig")
    name = f"gpuop-validate-attack-{POD_CREATES.index((what, change, refusal))}"
    pod = json.dumps(change(_validation_pod(name)))

    try:
        # `installed` waited for the policies
        done = fleet.kubectl_as(kubeconfig, "create", "-f", "-", stdin=pod)
    finally:
        plane.request(f"/api/v1/namespaces/{NS}/pods/{name}", method="DELETE")
    outcome = "created" if done.returncode == 0 else done.stderr.strip()
    print(f"\n{role} creates a pod with {what}: {outcome}")
    if refusal is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0, done.stdout
        assert "ValidatingAdmissionPolicy" in done.stderr, done.stderr
        assert refusal in done.stderr, done.stderr
