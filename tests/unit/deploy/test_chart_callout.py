"""The chart in callout mode (nats.auth.mode=callout, the default; issue 17, finding 3),
rendered by Helm: every gpuop pod connects with a projected token for gpuop-nats and no
password, each node agent service under a ServiceAccount of its own that the callout maps to
its role, the callout runs twice off GPU nodes with the right to review tokens and nothing
else, the server runs the shipped nats-server.conf with callout.conf in place of
accounts.conf, and the issuer key is an Ed25519 key Helm generates, whose public key an init
container gives the server. `nats.auth.mode=static` still renders the password users."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from gpuop.bus import callouts, grants, nkeys
from gpuop.cli import main
from tests.support.charts import (
    CHART,
    NAMESPACE,
    NODE_AGENTS,
    REPO,
    Manifest,
    Rendering,
    gpuop_containers,
    render_with,
    served_in,
)

pytestmark = pytest.mark.security

OWN_ISSUER = {"nats": {"auth": {"callout": {"issuerSecret": "gpuop-issuer"}}}}
"""An issuer Secret of one's own (`gpuop nats-auth --new-issuer-secret`), with `seed`."""
STATIC = {"nats": {"auth": {"mode": "static"}}}


@pytest.fixture(scope="module")
def rendering() -> Rendering:
    return render_with(None)  # callout mode is the default


def pod(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_every_service_connects_with_its_projected_token_and_no_password(
    rendering: Rendering,
) -> None:
    found = gpuop_containers(rendering)
    assert len(found) >= len(NODE_AGENTS)
    for workload, container in found:
        variables = env(container)
        name = workload["metadata"]["name"]
        assert "NATS_PASSWORD" not in variables, name
        assert "@" not in variables["GPUOP_NATS"], name
        assert variables["GPUOP_NATS_TOKEN_FILE"] == "/var/run/secrets/gpuop/nats/token"
        volumes = {v["name"]: v for v in pod(workload)["volumes"]}
        (source,) = volumes["nats-token"]["projected"]["sources"]
        assert source["serviceAccountToken"]["audience"] == "gpuop-nats", name
        assert source["serviceAccountToken"]["expirationSeconds"] == 3600
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["nats-token"] == "/var/run/secrets/gpuop/nats"
        assert variables["GPUOP_NATS_ID_KEY_FILE"].startswith(mounts["nats-ids"] + "/")


def accounts(rendering: Rendering) -> callouts.Accounts:
    (container,) = pod(rendering.get("Deployment", "gpuop-nats-auth"))["containers"]
    return callouts.Accounts.parse(env(container)["GPUOP_NATS_AUTH_ACCOUNTS"].split(","))


def test_each_service_account_is_the_role_of_its_service_and_of_no_other(
    rendering: Rendering,
) -> None:
    table = accounts(rendering)
    service_accounts = {m["metadata"]["name"] for m in rendering.all("ServiceAccount")}
    seen: dict[str, str] = {}
    for workload, container in gpuop_containers(rendering):
        account = pod(workload)["serviceAccountName"]
        assert account in service_accounts
        role = table.role(f"system:serviceaccount:{NAMESPACE}:{account}")
        variables = env(container)
        service = container["args"][1]
        expected = service if variables["GPUOP_ROLE"] == "node" else None
        if expected is None:
            expected = service if service == "upgrade-orchestrator" else f"{service}-cluster"
        assert role == expected, workload["metadata"]["name"]
        assert seen.setdefault(account, role) == role  # no ServiceAccount for two roles
    assert set(seen.values()) == grants.ROLES - {"observer"}


def test_the_callout_runs_twice_off_gpu_nodes_and_may_only_review_tokens_and_read_pods(
    rendering: Rendering,
) -> None:
    deployment = rendering.get("Deployment", "gpuop-nats-auth")
    spec = pod(deployment)
    assert deployment["spec"]["replicas"] == 2
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]} in expressions
    (container,) = spec["containers"]
    assert container["args"] == ["nats-auth"]
    assert container["securityContext"]["runAsNonRoot"] is True
    url = env(container)["GPUOP_NATS"]
    assert re.fullmatch(r"tls://nats-auth:\$\(NATS_AUTH_PASSWORD\)@\S+:4222", url)
    role = rendering.get("ClusterRole", "gpuop-nats-auth")
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    local = rendering.get("Role", "gpuop-nats-auth")
    assert local["metadata"]["namespace"] == NAMESPACE
    assert local["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert (
        rendering.get("RoleBinding", "gpuop-nats-auth")["subjects"][0]["name"] == "gpuop-nats-auth"
    )
    binding = rendering.get("ClusterRoleBinding", "gpuop-nats-auth")
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"] == "gpuop-nats-auth"
    issuer = {v["name"]: v for v in spec["volumes"]}["issuer"]["secret"]
    assert issuer["secretName"] == "gpuop-nats-issuer"
    assert issuer["items"] == [{"key": "key.pem", "path": "key.pem"}]
    assert env(container)["GPUOP_NATS_AUTH_ISSUER_SEED_FILE"] == "/etc/gpuop/nats-auth/key.pem"
    assert rendering.get("PodDisruptionBudget", "gpuop-nats-auth")["spec"]["minAvailable"] == 1


def test_the_server_runs_the_shipped_files_with_callout_conf_for_accounts_conf(
    rendering: Rendering,
) -> None:
    data = rendering.get("ConfigMap", "gpuop-nats-config")["data"]
    shipped = (REPO / "deploy" / "nats").joinpath
    assert set(data) == {"nats-server.conf", "callout.conf"}
    # the issuer from the init container's include, the rest of callout.conf as shipped
    assert data["callout.conf"] == shipped("callout.conf").read_text().replace(
        "issuer: $NATS_AUTH_ISSUER", 'include "../issuer/issuer.conf"'
    )
    server = shipped("nats-server.conf").read_text()
    assert data["nats-server.conf"] == server.replace(
        'include "accounts.conf"', 'include "callout.conf"'
    )
    (statefulset,) = rendering.all("StatefulSet")
    spec = pod(statefulset)
    (nats,) = spec["containers"]
    assert "NATS_AUTH_ISSUER" not in env(nats)
    mounts = {m["name"]: m for m in nats["volumeMounts"]}
    # ../issuer/issuer.conf from callout.conf in /etc/nats/config
    assert mounts["issuer"] == {"name": "issuer", "mountPath": "/etc/nats/issuer", "readOnly": True}
    assert "issuer-key" not in mounts, "the server never sees the private key"
    secret = rendering.get("Secret", "gpuop-nats-users")
    assert "NATS_AUTH_PASSWORD" in secret["data"]


def issuer_init(statefulset: Manifest) -> tuple[dict[str, Any], dict[str, Any]]:
    """The NATS pod's init container that writes the issuer, and the pod's volumes."""
    spec = pod(statefulset)
    (init,) = spec["initContainers"]
    return init, {v["name"]: v for v in spec["volumes"]}


def test_an_init_container_writes_the_issuer_of_the_generated_key_for_the_server(
    rendering: Rendering, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (statefulset,) = rendering.all("StatefulSet")
    init, volumes = issuer_init(statefulset)
    assert init["image"] == gpuop_containers(rendering)[0][1]["image"]
    assert init["securityContext"]["runAsNonRoot"] is True
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert mounts == {"issuer-key": "/etc/gpuop/nats-auth", "issuer": "/etc/nats/issuer"}
    assert volumes["issuer-key"]["secret"]["secretName"] == "gpuop-nats-issuer"
    assert volumes["issuer-key"]["secret"]["items"] == [{"key": "key.pem", "path": "key.pem"}]
    assert "emptyDir" in volumes["issuer"]

    # the key Helm generated, kept at upgrades and uninstalls, run through the init
    # container's own command: the server's include names its public key
    secret = rendering.get("Secret", "gpuop-nats-issuer")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pem = base64.b64decode(secret["data"]["key.pem"]).decode("ascii")
    assert pem.startswith("-----BEGIN PRIVATE KEY-----")
    key = nkeys.KeyPair.from_pem(pem, nkeys.Kind.ACCOUNT)
    (tmp_path / "key.pem").write_text(pem)
    arguments = [
        a.replace("/etc/gpuop/nats-auth", str(tmp_path)).replace("/etc/nats/issuer", str(tmp_path))
        for a in init["args"]
    ]
    assert main.main(arguments) == 0, capsys.readouterr().err
    assert f'issuer: "{key.public_key}"' in (tmp_path / "issuer.conf").read_text()


def test_each_install_generates_its_own_issuer_key() -> None:
    first = render_with(None).get("Secret", "gpuop-nats-issuer")["data"]["key.pem"]
    second = render_with(None).get("Secret", "gpuop-nats-issuer")["data"]["key.pem"]
    assert first != second


def test_an_issuer_secret_of_ones_own_is_read_as_its_seed_and_none_is_generated() -> None:
    own = render_with(OWN_ISSUER)
    assert not [s for s in own.all("Secret") if s["metadata"]["name"] == "gpuop-nats-issuer"]
    spec = pod(own.get("Deployment", "gpuop-nats-auth"))
    (container,) = spec["containers"]
    assert env(container)["GPUOP_NATS_AUTH_ISSUER_SEED_FILE"] == "/etc/gpuop/nats-auth/seed"
    issuer = {v["name"]: v for v in spec["volumes"]}["issuer"]["secret"]
    assert (issuer["secretName"], issuer["items"]) == (
        "gpuop-issuer",
        [{"key": "seed", "path": "seed"}],
    )
    (statefulset,) = own.all("StatefulSet")
    init, volumes = issuer_init(statefulset)
    assert "/etc/gpuop/nats-auth/seed" in init["args"]
    assert volumes["issuer-key"]["secret"]["secretName"] == "gpuop-issuer"


def test_an_unknown_mode_fails_saying_what_to_do() -> None:
    with pytest.raises(helm.HelmError, match=r"nats\.auth\.mode must be static or callout"):
        render_with({"nats": {"auth": {"mode": "jwt"}}})


def test_a_token_may_live_at_most_the_day_the_callout_takes() -> None:
    for seconds, said in ((599, "at least 600"), (86401, "at most 86400")):
        with pytest.raises(helm.HelmError, match=said):
            render_with({"nats": {"auth": {"callout": {"tokenExpirationSeconds": seconds}}}})


def test_static_mode_renders_the_password_users_and_the_shipped_files_unchanged() -> None:
    rendering = render_with(STATIC)
    assert not [m for m in rendering.all() if "nats-auth" in m["metadata"]["name"]]
    assert not [m for m in rendering.all() if "issuer" in m["metadata"]["name"]]
    for workload, container in gpuop_containers(rendering):
        assert "NATS_PASSWORD" in env(container)
        assert "nats-token" not in {v["name"] for v in pod(workload)["volumes"]}
    data = rendering.get("ConfigMap", "gpuop-nats-config")["data"]
    shipped = (REPO / "deploy" / "nats").joinpath
    assert data == {
        name: shipped(name).read_text() for name in ("nats-server.conf", "accounts.conf")
    }
    (statefulset,) = rendering.all("StatefulSet")
    assert "initContainers" not in pod(statefulset)


def test_the_callouts_metrics_are_scraped_and_guarded_as_every_services(
    rendering: Rendering,
) -> None:
    service = rendering.get("Service", "gpuop-nats-auth-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9409, "targetPort": "metrics", "protocol": "TCP"}
    ]
    policy = rendering.get("NetworkPolicy", "gpuop-metrics")
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
    assert 9409 in ports

    guarded = render_with({"metrics": {"webConfig": "gpuop-web-config", "scheme": "https"}})
    spec = pod(guarded.get("Deployment", "gpuop-nats-auth"))
    (container,) = spec["containers"]
    assert env(container)["GPUOP_METRICS_WEB_CONFIG"] == "/etc/gpuop/web-config/web-config.yml"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["web-config"]["secret"]["secretName"] == "gpuop-web-config"


def test_extra_seed_keys_are_mounted_and_listed_after_the_current_one() -> None:
    generated: dict[str, Any] = {"extraSeedKeys": ["old.pem"]}
    own: dict[str, Any] = {"issuerSecret": "gpuop-issuer", "extraSeedKeys": ["old.pem"]}
    for callout, current in ((generated, "key.pem"), (own, "seed")):
        rotating = render_with({"nats": {"auth": {"callout": callout}}})
        spec = pod(rotating.get("Deployment", "gpuop-nats-auth"))
        (container,) = spec["containers"]
        files = f"/etc/gpuop/nats-auth/{current},/etc/gpuop/nats-auth/old.pem"
        assert env(container)["GPUOP_NATS_AUTH_ISSUER_SEED_FILE"] == files
        issuer = {v["name"]: v for v in spec["volumes"]}["issuer"]["secret"]
        assert [item["key"] for item in issuer["items"]] == [current, "old.pem"]
        # the server is given the current key's issuer only
        (statefulset,) = rotating.all("StatefulSet")
        _, volumes = issuer_init(statefulset)
        assert [i["key"] for i in volumes["issuer-key"]["secret"]["items"]] == [current]


@pytest.mark.parametrize("version", ["1.27", kubernetes_validate.latest_version()])
def test_callout_mode_renders_valid_objects_and_lints_clean(
    rendering: Rendering, version: str
) -> None:
    for manifest in rendering.all():
        if manifest["kind"] in {"ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"}:
            continue
        if not served_in(manifest, version):
            continue
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{manifest['kind']} {manifest['metadata']['name']} {path}: {error}")
    helm.disable_logging()
    linted = helm.lint(CHART, None, strict=True, namespace=NAMESPACE)
    assert linted["errors"] == []


def test_a_cluster_roles_replicas_share_one_message_id_key_and_node_agents_keep_their_own(
    rendering: Rendering,
) -> None:
    # A new orchestrator leader re-publishes under its predecessor's ids: the server drops
    # the repeats only if both replicas make the same Nats-Msg-Id. A node agent's key stays
    # in its own pod, so no other node can take its ids.
    (keys,) = [s for s in rendering.all("Secret") if s["metadata"]["name"].endswith("-id-keys")]
    shared: dict[str, str] = {}
    for workload, container in gpuop_containers(rendering):
        name = workload["metadata"]["name"]
        assert env(container)["GPUOP_NATS_ID_KEY_FILE"] == "/var/lib/gpuop/nats-ids/key", name
        volume = {v["name"]: v for v in pod(workload)["volumes"]}["nats-ids"]
        if workload["kind"] == "DaemonSet":
            assert "emptyDir" in volume, name
            continue
        assert volume["secret"]["secretName"] == keys["metadata"]["name"], name
        (item,) = volume["secret"]["items"]
        assert item["path"] == "key", name
        shared[name] = item["key"]
    assert any(name.endswith("upgrade-orchestrator") for name in shared)
    assert sorted(shared.values()) == sorted(keys["data"]), "one key per cluster role"
    assert len(set(keys["data"].values())) == len(keys["data"]), "keys differ between roles"
