"""Who can read the chart's Secrets, the NATS issuer key above all (whoever reads it signs
NATS users of any role): no ServiceAccount of the chart may get, list or watch a Secret,
the issuer key is mounted by the callout's pods and the NATS servers' init container
alone, and the one way to a Secret RBAC leaves, creating pods in the release namespace, is
the orchestrator's for its validation pod (an admission policy keeps it to that pod:
tests/integration/real_cluster/test_chart_real.py)."""

from __future__ import annotations

import base64
from typing import Any

import helm_python as helm
import pytest

from tests.support.charts import NAMESPACE, STATIC_NATS, Manifest, Rendering, render, render_with

pytestmark = pytest.mark.security

ISSUER = "gpuop-nats-issuer"
RENDERINGS = ("defaults", "all-features", "external-nats", "nats-cluster", "static")


def rendered(name: str) -> Rendering:
    return render_with(STATIC_NATS) if name == "static" else render(name)


def rules(rendering: Rendering) -> list[tuple[Manifest, dict[str, Any]]]:
    return [
        (role, rule)
        for role in rendering.all("Role") + rendering.all("ClusterRole")
        for rule in role.get("rules", [])
    ]


def core(rule: dict[str, Any]) -> bool:
    return bool({"", "*"} & set(rule.get("apiGroups", [])))


def pod_spec(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def secrets_of(container: dict[str, Any], volumes: dict[str, dict[str, Any]]) -> set[str]:
    """The Secrets a container reads: mounted, in its environment, or whole as variables."""
    found = set()
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})  # none: a StatefulSet's claim
        if "secret" in volume:
            found.add(volume["secret"]["secretName"])
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                found.add(source["secret"]["name"])
    for variable in container.get("env", []):
        if "secretKeyRef" in variable.get("valueFrom", {}):
            found.add(variable["valueFrom"]["secretKeyRef"]["name"])
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            found.add(source["secretRef"]["name"])
    return found


def readers(rendering: Rendering, secret: str) -> set[str]:
    """`workload/container` of every container that reads `secret`."""
    found = set()
    for workload in rendering.workloads():
        spec = pod_spec(workload)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec.get("initContainers", []) + spec["containers"]:
            if secret in secrets_of(container, volumes):
                found.add(f"{workload['metadata']['name']}/{container['name']}")
    return found


@pytest.mark.parametrize("values", RENDERINGS)
def test_no_service_account_of_the_chart_may_read_a_secret(values: str) -> None:
    rendering = rendered(values)
    assert rules(rendering), "no roles rendered"
    wrong = [
        f"{role['kind']} {role['metadata']['name']}: {rule}"
        for role, rule in rules(rendering)
        if (core(rule) and {"secrets", "*"} & set(rule.get("resources", [])))
        or "*" in rule.get("verbs", [])
    ]
    assert wrong == []


@pytest.mark.parametrize("values", ["defaults", "nats-cluster"])
def test_the_issuer_key_is_read_by_the_callout_and_the_servers_init_container_alone(
    values: str,
) -> None:
    rendering = rendered(values)
    assert readers(rendering, ISSUER) == {"gpuop-nats-auth/nats-auth", "gpuop-nats/nats-issuer"}


@pytest.mark.parametrize("values", ["defaults", "nats-cluster", "static"])
def test_the_nats_servers_read_bcrypt_hashes_and_no_password(values: str) -> None:
    """The servers' pods run where an attacker may reach and a kubelet reads every Secret its
    pods name: the passwords stay with the services, the servers get hashes
    (tests/integration/deploy/test_nats_server_hashes.py runs them)."""
    rendering = rendered(values)
    assert readers(rendering, "gpuop-nats-server-users") == {"gpuop-nats/nats"}
    assert not {r for r in readers(rendering, "gpuop-nats-users") if r.startswith("gpuop-nats/")}
    hashes = rendering.get("Secret", "gpuop-nats-server-users")["data"]
    assert set(hashes) == set(rendering.get("Secret", "gpuop-nats-users")["data"])
    for key, value in hashes.items():
        assert base64.b64decode(value).startswith(b"$2a$10$"), key


def test_the_passwords_of_an_existing_secret_are_hashed_at_install_so_it_must_exist() -> None:
    # `helm template` reads no cluster: as an install would find the Secret missing
    with pytest.raises(helm.HelmError, match=r"nats\.auth\.existingSecret mine has no"):
        render_with({"nats": {"auth": {"existingSecret": "mine"}}})


def test_static_mode_has_no_issuer_key_to_read() -> None:
    rendering = rendered("static")
    assert readers(rendering, ISSUER) == set()
    assert not [s for s in rendering.all("Secret") if s["metadata"]["name"] == ISSUER]


@pytest.mark.parametrize("values", RENDERINGS)
def test_only_the_orchestrator_may_create_pods_and_only_in_the_release_namespace(
    values: str,
) -> None:
    """A pod creator could mount any Secret of its namespace: the orchestrator's validation
    pods are the only pods the chart's ServiceAccounts may create."""
    rendering = rendered(values)
    creators = {
        (role["kind"], role["metadata"]["name"], role["metadata"].get("namespace"))
        for role, rule in rules(rendering)
        if core(rule)
        and {"pods", "*"} & set(rule.get("resources", []))
        and {"create", "*"} & set(rule["verbs"])
    }
    assert creators == {("Role", "gpuop-upgrade-orchestrator-validation-pods", NAMESPACE)}
