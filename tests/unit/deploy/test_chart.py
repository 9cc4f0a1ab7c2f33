"""The Helm chart: Helm's lint and rendering with the default, all-features, external-NATS and
NATS-cluster values, every manifest valid Kubernetes, and every setting agreeing with the code
it deploys (settings, config models, metric names, the CRD, deploy/nats, the image's user)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from prometheus_client import CollectorRegistry

from gpuop.events.upgrade import UpgradeState
from gpuop.observability.metrics import BusMetrics
from gpuop.runtime import services, settings
from gpuop.services.device_plugin import config as device_plugin_config
from gpuop.services.discovery import config as discovery_config
from gpuop.services.driver_manager import config as driver_manager_config
from gpuop.services.network_manager import config as network_manager_config
from gpuop.services.telemetry import catalog
from gpuop.services.telemetry import config as telemetry_config
from gpuop.services.telemetry.operator_metrics import OperatorMetrics
from gpuop.services.upgrade_orchestrator import config as orchestrator_config
from tests.support.charts import (
    CHART,
    NAMESPACE,
    NODE_AGENTS,
    POD_IP,
    REPO,
    STATIC_NATS,
    VALUES,
    Manifest,
    Rendering,
    crd_texts,
    environment,
    gpuop_containers,
    image_user,
    lint,
    nats_address,
    render,
    render_with,
    served_in,
)

KUBERNETES = ("1.27", kubernetes_validate.latest_version())
"""The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest known."""
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"}
"""Kinds of the Prometheus and cert-manager operators: kubernetes-validate has no schema for
them, so `test_operator_objects_have_what_their_operators_read` checks them."""
PRIVILEGED = {"driver-manager"}
CONFIG_LOADERS = {
    "discovery": discovery_config.load_config,
    "driver-manager": driver_manager_config.load,
    "device-plugin": device_plugin_config.load_configs,  # one config, or named ones
    "network-manager": network_manager_config.load_config,
    "telemetry": telemetry_config.load_config,
    "upgrade-orchestrator": orchestrator_config.load_config,
}


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_finds_nothing_wrong(values: str) -> None:
    report = lint(values)

    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


@pytest.mark.parametrize("version", KUBERNETES)
@pytest.mark.parametrize("values", VALUES)
def test_every_manifest_is_valid_kubernetes_in_strict_mode(values: str, version: str) -> None:
    rendering = render(values)
    checked = 0
    for template, manifest in rendering.manifests:
        if manifest["kind"] in OPERATOR_KINDS:
            continue
        if not served_in(manifest, version):
            continue
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{template}: {manifest['kind']} {path}: {error.message}")
        checked += 1

    assert checked >= 35


def test_the_crd_is_valid_kubernetes_and_the_one_in_deploy_crds() -> None:
    committed = (REPO / "deploy" / "crds" / "gpuclusterpolicies.gpuop.io.yaml").read_text()
    shipped = crd_texts()

    assert list(shipped) == ["gpuop/crds/gpuclusterpolicies.gpuop.io.yaml"]
    assert next(iter(shipped.values())) == committed
    for version in KUBERNETES:
        kubernetes_validate.validate(yaml.safe_load(committed), version, strict=True)


def test_the_bundled_nats_in_static_mode_runs_deploy_nats_unchanged() -> None:
    config = render_with(STATIC_NATS).get("ConfigMap", "gpuop-nats-config")

    for name in ("nats-server.conf", "accounts.conf"):
        assert config["data"][name] == (REPO / "deploy" / "nats" / name).read_text(), name


@pytest.mark.parametrize(
    ("overrides", "users"), [(None, "callout.conf"), (STATIC_NATS, "accounts.conf")]
)
def test_every_nats_user_gets_a_password_that_nats_reads_as_a_string(
    overrides: dict[str, Any] | None, users: str
) -> None:
    # callout mode: the callout's own user, admin and observer; static: every user
    accounts = (REPO / "deploy" / "nats" / users).read_text()
    variables = set(re.findall(r"password: \$([A-Z_]+)", accounts))
    secret = render_with(overrides).get("Secret", "gpuop-nats-users")

    assert variables <= set(secret["data"])
    if overrides is not None:
        assert set(secret["data"]) == variables
    template = (CHART / "templates" / "nats" / "users.yaml").read_text()
    # nats-server parses the variables as values: a leading digit would make a number
    assert "(randAlpha 1)" in template


@pytest.mark.parametrize("values", VALUES)
def test_every_service_starts_with_valid_settings_and_its_own_nats_user(values: str) -> None:
    rendering = render(values)
    started = set()
    for workload, container in gpuop_containers(rendering):
        service = container["args"][1]
        environ = environment(container, node="gpu-1.example.com")
        loaded = settings.load({"service": service}, environ)
        started.add((service, loaded.role))

        assert loaded.role in services.lookup(service).roles
        user = workload["metadata"]["name"].removeprefix("gpuop-")
        assert all(url.startswith(("tls://", "nats://")) for url in loaded.nats)
        if "GPUOP_NATS_TOKEN_FILE" in environ:
            # callout mode: the pod's token is the credential, its ServiceAccount the user
            assert not any("@" in url for url in loaded.nats)
            assert workload["spec"]["template"]["spec"]["serviceAccountName"] == f"gpuop-{user}"
        else:
            assert {url.split("://")[1].split(":")[0] for url in loaded.nats} == {user}
        assert loaded.listen_address == (POD_IP, container["ports"][0]["containerPort"])
        assert str(loaded.config) == "/etc/gpuop/config.yaml"
        if loaded.role is settings.Role.NODE:
            assert (loaded.node, str(loaded.host_root)) == ("gpu-1.example.com", "/host")

    node = settings.Role.NODE
    assert {(s, node) for s in NODE_AGENTS} <= started
    assert ("upgrade-orchestrator", settings.Role.CLUSTER) in started


@pytest.mark.parametrize("values", VALUES)
def test_every_config_file_passes_its_services_config_model(values: str, tmp_path: Path) -> None:
    rendering = render(values)
    checked = []
    for config_map in rendering.all("ConfigMap"):
        name = config_map["metadata"]["name"]
        if not name.endswith("-config") or name == "gpuop-nats-config":
            continue
        service = name.removeprefix("gpuop-").removesuffix("-config")
        path = tmp_path / f"{service}.yaml"
        path.write_text(config_map["data"]["config.yaml"])
        CONFIG_LOADERS[service](path)
        checked.append(service)

    assert sorted(checked) == sorted(CONFIG_LOADERS)


def test_the_orchestrator_leads_in_the_release_namespace_and_waits_for_deployed_operands() -> None:
    config = yaml.safe_load(
        render("defaults").get("ConfigMap", "gpuop-upgrade-orchestrator-config")["data"][
            "config.yaml"
        ]
    )
    without_telemetry = render_with({"telemetry": {"enabled": False}})
    fewer = yaml.safe_load(
        without_telemetry.get("ConfigMap", "gpuop-upgrade-orchestrator-config")["data"][
            "config.yaml"
        ]
    )

    assert config["lease_namespace"] == NAMESPACE
    assert config["operands"] == ["discovery", "device-plugin", "telemetry"]
    assert fewer["operands"] == ["discovery", "device-plugin"]


@pytest.mark.parametrize("values", VALUES)
def test_node_agents_have_no_kubernetes_token_and_only_the_driver_manager_is_privileged(
    values: str,
) -> None:
    rendering = render(values)
    daemonsets = {
        d["metadata"]["name"].removeprefix("gpuop-"): d for d in rendering.all("DaemonSet")
    }

    assert set(daemonsets) == set(NODE_AGENTS)
    for service, daemonset in daemonsets.items():
        pod = daemonset["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        security = container["securityContext"]
        assert pod["automountServiceAccountToken"] is False, service
        assert security.get("privileged", False) is (service in PRIVILEGED), service
        if service not in PRIVILEGED:
            assert security["allowPrivilegeEscalation"] is False, service
            assert security["capabilities"]["drop"] == ["ALL"], service
            assert security["readOnlyRootFilesystem"] is True, service
        writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
        assert ("/host" in writable) is (service == "driver-manager"), service
    discovery = daemonsets["discovery"]["spec"]["template"]["spec"]
    assert discovery["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert daemonsets["network-manager"]["spec"]["template"]["spec"]["hostNetwork"] is True


@pytest.mark.parametrize("values", VALUES)
def test_cluster_roles_run_unprivileged_as_the_images_user(values: str) -> None:
    rendering = render(values)
    user = image_user()

    for deployment in rendering.all("Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == user
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in security


def rules_of(rendering: Rendering, account: str) -> dict[tuple[str, str], set[str]]:
    """(namespace or "*", group/resource) -> verbs, over every binding of `account`."""
    granted: dict[tuple[str, str], set[str]] = {}
    for binding in rendering.all("ClusterRoleBinding") + rendering.all("RoleBinding"):
        if not any(s["name"] == account for s in binding["subjects"]):
            continue
        kind = binding["roleRef"]["kind"]
        namespace = binding["metadata"].get("namespace", "*")
        role = rendering.get(kind, binding["roleRef"]["name"])
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    key = (namespace, f"{group}/{resource}" if group else resource)
                    names = rule.get("resourceNames")
                    verbs = {f"{v}:{','.join(names)}" if names else v for v in rule["verbs"]}
                    granted.setdefault(key, set()).update(verbs)
    return granted


def test_rbac_grants_each_role_exactly_what_its_calls_need() -> None:
    rendering = render("defaults")
    lease = "get:gpuop-upgrade-orchestrator,patch:gpuop-upgrade-orchestrator"

    assert rules_of(rendering, "gpuop-node-agent") == {}
    assert rules_of(rendering, "gpuop-telemetry-cluster") == {}
    assert rules_of(rendering, "gpuop-discovery-cluster") == {
        ("*", "nodes"): {"get", "list", "watch", "patch"},
        ("default", "events"): {"create"},
    }
    assert rules_of(rendering, "gpuop-device-plugin-cluster") == {
        ("*", "resource.k8s.io/resourceslices"): {
            "get", "list", "watch", "create", "update", "delete",
        },
        ("*", "resource.k8s.io/resourceclaims"): {"get", "list", "watch"},
        ("*", "nodes"): {"get"},  # the slices' ownerReference
    }  # fmt: skip
    assert rules_of(rendering, "gpuop-network-manager-cluster") == {
        ("*", "gpuop.io/gpuclusterpolicies"): {"get", "list", "watch"},
        ("*", "nodes"): {"list", "watch"},  # the address blocks' nodes
        ("*", "k8s.cni.cncf.io/network-attachment-definitions"): {
            "get", "list", "watch", "create", "patch", "delete",
        },
    }  # fmt: skip
    assert rules_of(rendering, "gpuop-upgrade-orchestrator") == {
        ("*", "nodes"): {"get", "list", "watch", "patch"},
        ("*", "nodes/status"): {"get", "patch"},  # the GPUHealthy condition
        ("*", "pods"): {"get", "list", "watch", "delete"},
        ("gpuop-system", "pods"): {"create"},  # the validation ladder's pod, here only
        ("*", "pods/eviction"): {"create"},
        ("*", "policy/poddisruptionbudgets"): {"list"},
        ("*", "resource.k8s.io/resourceclaims"): {"get"},
        # the device-api switch's validation pod's claim, here only
        ("gpuop-system", "resource.k8s.io/resourceclaims"): {"create", "delete"},
        ("*", "resource.k8s.io/devicetaintrules"): {"get", "create", "update", "delete"},
        ("*", "gpuop.io/gpuclusterpolicies"): {"get", "list", "watch"},
        ("*", "gpuop.io/gpuclusterpolicies/status"): {"get", "patch"},
        (NAMESPACE, "coordination.k8s.io/leases"): {"create", *lease.split(",")},
        (NAMESPACE, "configmaps"): {"get"},  # mig.configMap, the MIG configs
        ("default", "events"): {"create"},
    }
    service_accounts = {s["metadata"]["name"]: s for s in rendering.all("ServiceAccount")}
    assert all(s["automountServiceAccountToken"] is False for s in service_accounts.values())


def test_nvidias_device_classes_select_gpuops_devices_by_type() -> None:
    rendering = render("defaults")
    without = render_with({"devicePlugin": {"deviceClasses": {"extendedResourceName": False}}})
    none = render_with({"devicePlugin": {"deviceClasses": {"enabled": False}}})

    gpu = rendering.get("DeviceClass", "gpu.nvidia.com")["spec"]
    mig = rendering.get("DeviceClass", "mig.nvidia.com")["spec"]
    assert [s["cel"]["expression"] for s in (*gpu["selectors"], *mig["selectors"])] == [
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    ]
    assert gpu["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in mig
    assert "extendedResourceName" not in without.get("DeviceClass", "gpu.nvidia.com")["spec"]
    assert none.all("DeviceClass") == []
    deployment = rendering.get("Deployment", "gpuop-device-plugin-cluster")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert "cluster" in " ".join(container.get("args", []) + container.get("command", [])) or any(
        env.get("value") == "cluster" for env in container.get("env", [])
    )


def test_the_orchestrator_runs_two_replicas_apart_behind_a_disruption_budget() -> None:
    rendering = render("defaults")
    deployment = rendering.get("Deployment", "gpuop-upgrade-orchestrator")
    budget = rendering.get("PodDisruptionBudget", "gpuop-upgrade-orchestrator")
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    assert deployment["spec"]["replicas"] == 2
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


@pytest.mark.parametrize("values", VALUES)
def test_every_nats_client_trusts_the_ca_of_the_server_it_reaches_and_public_cas(
    values: str,
) -> None:
    rendering = render(values)
    for workload, container in gpuop_containers(rendering):
        environ = environment(container, node="n")
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        (init,) = pod["initContainers"]
        written = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
        read = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

        # SSL_CERT_FILE replaces Python's default bundle: it must hold the public CAs too
        assert environ["SSL_CERT_FILE"] == "/etc/gpuop/trust/ca-bundle.crt"
        assert init["command"][-1] == (
            "cat /etc/ssl/certs/ca-certificates.crt /etc/gpuop/nats-ca/ca.crt"
            " > /etc/gpuop/trust/ca-bundle.crt"
        )
        assert written["/etc/gpuop/trust"] == read["/etc/gpuop/trust"] == "trust"
        ca = volumes[written["/etc/gpuop/nats-ca"]]["secret"]
        assert ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
        assert init["securityContext"]["runAsUser"] == image_user()
        if values == "external-nats":
            assert ca["secretName"] == "nats-ca"
            assert nats_addresses(environ) == ["nats.messaging.svc:4222"]
        else:
            server = rendering.get("StatefulSet", "gpuop-nats")["spec"]["template"]["spec"]
            tls = next(v for v in server["volumes"] if v["name"] == "tls")
            assert ca["secretName"] == tls["secret"]["secretName"]
            if values == "nats-cluster":
                servers = [f"{name}:4222" for name in server_names(rendering)]
                assert nats_addresses(environ) == servers
            else:
                assert nats_addresses(environ) == [f"gpuop-nats.{NAMESPACE}.svc:4222"]


def nats_addresses(environ: dict[str, str]) -> list[str]:
    """host:port of each URL of GPUOP_NATS."""
    return [nats_address(url) for url in environ["GPUOP_NATS"].split(",")]


def server_names(rendering: Rendering) -> list[str]:
    """The stable DNS name of every pod of the bundled NATS, through its StatefulSet's Service."""
    statefulset = rendering.get("StatefulSet", "gpuop-nats")
    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    return [
        f"{name}-{ordinal}.{service}.{NAMESPACE}.svc.cluster.local"
        for ordinal in range(statefulset["spec"]["replicas"])
    ]


def test_a_helm_generated_certificate_names_the_nats_service() -> None:
    secret = render("defaults").get("Secret", "gpuop-nats-tls")

    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}


def test_the_bundled_cluster_runs_three_servers_apart_behind_a_disruption_budget() -> None:
    rendering = render("nats-cluster")
    statefulset = rendering.get("StatefulSet", "gpuop-nats")
    budget = rendering.get("PodDisruptionBudget", "gpuop-nats")
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    pod = statefulset["spec"]["template"]["spec"]

    assert statefulset["spec"]["replicas"] == 3
    # a server is started only once it reaches a majority: the pods must start together
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"] == {
        "requests": {"storage": "20Gi"}
    }
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    anti = pod["affinity"]["podAntiAffinity"]
    (required,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["topologyKey"] == "kubernetes.io/hostname"
    assert required["labelSelector"]["matchLabels"].items() <= labels.items()

    preferred = render_with({"nats": {"cluster": {"enabled": True, "antiAffinity": "preferred"}}})
    pod = preferred.get("StatefulSet", "gpuop-nats")["spec"]["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti


def test_a_single_server_has_no_cluster_parts() -> None:
    rendering = render("defaults")
    statefulset = rendering.get("StatefulSet", "gpuop-nats")
    headless = rendering.get("Service", "gpuop-nats-headless")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]

    assert statefulset["spec"]["replicas"] == 1
    assert "podManagementPolicy" not in statefulset["spec"]
    assert "podAntiAffinity" not in statefulset["spec"]["template"]["spec"]["affinity"]
    assert {p["metadata"]["name"] for p in rendering.all("PodDisruptionBudget")} == {
        "gpuop-nats-auth",
        "gpuop-upgrade-orchestrator",
    }
    assert container["args"] == ["-c", "/etc/nats/config/nats-server.conf"]
    assert "env" not in container
    assert {p["port"] for p in headless["spec"]["ports"]} == {4222, 8222}
    config = rendering.get("ConfigMap", "gpuop-nats-config")["data"]
    assert set(config) == {"nats-server.conf", "callout.conf"}


def test_the_servers_route_to_each_other_through_the_headless_service() -> None:
    rendering = render("nats-cluster")
    statefulset = rendering.get("StatefulSet", "gpuop-nats")
    headless = rendering.get("Service", statefulset["spec"]["serviceName"])
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    routes = next(p for p in headless["spec"]["ports"] if p["port"] == 6222)

    assert headless["spec"]["clusterIP"] == "None"
    # a server's name resolves before it is ready, or no server could reach a majority
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert ports[routes["targetPort"]] == 6222
    assert container["args"] == ["-c", "/etc/nats/config/nats-cluster.conf"]
    # cluster.conf's server_name: $POD_NAME, one name per server
    assert container["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]


def test_the_cluster_runs_deploy_nats_unchanged_with_a_route_to_every_server() -> None:
    rendering = render("nats-cluster")
    config = rendering.get("ConfigMap", "gpuop-nats-config")["data"]
    cluster = config["cluster.conf"]
    code = "\n".join(line.split("#", 1)[0] for line in cluster.splitlines())
    block = re.search(r"^cluster \{$(?P<body>.*)^\}$", code, re.M | re.S)

    shipped = (REPO / "deploy" / "nats").joinpath
    assert config["cluster.conf"] == shipped("cluster.conf").read_text()
    # callout mode, as on one server (test_chart_callout)
    assert config["nats-server.conf"] == shipped("nats-server.conf").read_text().replace(
        'include "accounts.conf"', 'include "callout.conf"'
    )
    assert "callout.conf" in config
    static = render_with({"nats": {"auth": {"mode": "static"}, "cluster": {"enabled": True}}})
    static_config = static.get("ConfigMap", "gpuop-nats-config")["data"]
    for name in ("nats-server.conf", "accounts.conf", "cluster.conf"):
        assert static_config[name] == shipped(name).read_text(), name
    includes = re.findall(r'^include "([^"]+)"$', config["nats-cluster.conf"], re.M)
    assert includes == ["nats-server.conf", "cluster.conf"]
    assert re.search(r"^server_name: \$POD_NAME$", code, re.M)
    assert block, "cluster.conf has no cluster block"
    body = block["body"]
    assert re.search(r"^\s+name: gpuop$", body, re.M)
    assert re.search(r"^\s+listen: 0\.0\.0\.0:6222$", body, re.M)
    assert re.search(r'^\s+include "routes.conf"$', body, re.M)
    tls = re.search(r"^\s+tls \{(?P<tls>[^}]*)\}", body, re.M)
    assert tls, "the routes have no TLS"
    files = dict(re.findall(r'^\s*(\w+_file): "([^"]+)"$', tls["tls"], re.M))
    assert files == {
        "cert_file": "/etc/nats/tls/tls.crt",
        "key_file": "/etc/nats/tls/tls.key",
        "ca_file": "/etc/nats/tls/ca.crt",
    }
    assert "verify_cert_and_check_known_urls: true" in tls["tls"]
    routes = re.findall(r'^\s+"nats://([^"]+)"$', config["routes.conf"], re.M)
    assert routes == [f"{name}:6222" for name in server_names(rendering)]
    assert len(routes) == 3


def certificate_names(secret: Manifest) -> tuple[list[str], set[x509.ObjectIdentifier]]:
    """The DNS names of a kubernetes.io/tls Secret's certificate, and its extended key usages."""
    certificate = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    return names.get_values_for_type(x509.DNSName), set(usages)


def test_the_certificate_names_every_server_and_serves_routes_both_ways() -> None:
    rendering = render("nats-cluster")
    servers = server_names(rendering)
    wildcard = f"*.gpuop-nats-headless.{NAMESPACE}.svc.cluster.local"
    names, usages = certificate_names(rendering.get("Secret", "gpuop-nats-tls"))

    assert set(servers) | {wildcard, f"gpuop-nats.{NAMESPACE}.svc"} <= set(names)
    # a route's TLS is mutual: each server presents the certificate as a client too
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= usages

    managed = render_with({"nats": {"cluster": {"enabled": True}, "tls": {"mode": "certManager"}}})
    spec = managed.get("Certificate", "gpuop-nats")["spec"]
    assert set(servers) | {wildcard} <= set(spec["dnsNames"])
    assert spec["usages"] == ["server auth", "client auth"]
    single = render_with({"nats": {"tls": {"mode": "certManager"}}})
    assert single.get("Certificate", "gpuop-nats")["spec"]["usages"] == ["server auth"]


def test_every_service_knows_every_server_and_keeps_three_copies() -> None:
    rendering = render("nats-cluster")
    servers = [f"{name}:4222" for name in server_names(rendering)]
    checked = 0
    for _, container in gpuop_containers(rendering):
        environ = environment(container, node="gpu-1.example.com")
        loaded = settings.load({"service": container["args"][1]}, environ)

        assert environ["GPUOP_NATS_REPLICAS"] == "3"
        assert loaded.nats_replicas == 3
        assert [nats_address(url) for url in loaded.nats] == servers
        assert all(url.startswith("tls://") for url in loaded.nats)
        checked += 1

    assert checked == 10


@pytest.mark.parametrize(
    ("overrides", "servers", "replicas"),
    [
        ({}, 1, "1"),
        ({"cluster": {"enabled": True, "replicas": 5}}, 5, "5"),
        # JetStream keeps at most five copies, however many servers there are
        ({"cluster": {"enabled": True, "replicas": 7}}, 7, "5"),
        ({"enabled": False, "external": {"address": "nats.messaging.svc:4222"}}, 1, "1"),
        (
            {"enabled": False, "external": {"replicas": 3, "address": (
                "nats-0.nats.messaging.svc:4222, nats-1.nats.messaging.svc:4222,"
                "nats-2.nats.messaging.svc:4222")}},
            3,
            "3",
        ),
    ],
)  # fmt: skip
def test_the_services_keep_a_copy_per_server_up_to_five(
    overrides: dict[str, Any], servers: int, replicas: str
) -> None:
    rendering = render_with({"nats": overrides})
    for _, container in gpuop_containers(rendering):
        environ = environment(container, node="n")

        assert environ["GPUOP_NATS_REPLICAS"] == replicas
        addresses = nats_addresses(environ)
        assert len(addresses) == servers
        assert all(" " not in address for address in addresses)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_a_cluster_of_an_even_number_or_fewer_than_three_servers_fails(replicas: int) -> None:
    message = f"nats.cluster.replicas must be an odd number of at least 3, not {replicas}"

    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render_with({"nats": {"cluster": {"enabled": True, "replicas": replicas}}})


def test_operator_objects_have_what_their_operators_read() -> None:
    rendering = render("all-features")
    metrics_services = [
        s for s in rendering.all("Service") if s["metadata"]["labels"].get("gpuop.io/metrics")
    ]
    (monitor,) = rendering.all("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    ports = {p["name"] for s in metrics_services for p in s["spec"]["ports"]}

    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == ports
    assert all(selector.items() <= s["metadata"]["labels"].items() for s in metrics_services)
    assert len(metrics_services) == 11  # ten services and the NATS auth callout
    workloads = rendering.workloads()
    for service in metrics_services:
        (selected,) = [
            w
            for w in workloads
            if service["spec"]["selector"].items()
            <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        (container,) = selected["spec"]["template"]["spec"]["containers"]
        assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]

    (rule,) = rendering.all("PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert {"GpuopGpuXidErrors", "GpuopUpgradeFailed", "GpuopUpgradeStepPastDeadline"} <= set(
        alerts
    )
    assert all(a["labels"]["severity"] in ("warning", "critical") for a in alerts.values())
    assert all(a["annotations"]["summary"] and a["expr"] for a in alerts.values())

    certificates = {c["metadata"]["name"]: c for c in rendering.all("Certificate")}
    issuers = {i["metadata"]["name"] for i in rendering.all("Issuer")}
    server = certificates["gpuop-nats"]
    assert server["spec"]["issuerRef"]["name"] in issuers
    assert "gpuop-nats.gpuop-system.svc" in server["spec"]["dnsNames"]
    statefulset = rendering.get("StatefulSet", "gpuop-nats")["spec"]["template"]["spec"]
    tls = next(v for v in statefulset["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == server["spec"]["secretName"]


def test_the_alerts_name_only_metrics_that_telemetry_exports() -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    BusMetrics(registry)  # every service's own /metrics
    exported = set(catalog.NAMES)
    for family in registry.collect():
        exported |= {sample.name for sample in family.samples}
        exported.add(family.name)
    (rule,) = render("all-features").all("PrometheusRule")

    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            names = set(re.findall(r"\b(?:gpuop|DCGM)_[A-Za-z_]+\b", alert["expr"]))
            assert names, alert["alert"]
            assert names <= exported, f"{alert['alert']} reads {names - exported}"
            states = set(re.findall(r'state="([^"]+)"', alert["expr"]))
            assert states <= {state.value for state in UpgradeState}


def test_the_xid_alert_ignores_the_xids_telemetry_treats_as_application_errors() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    assert tuple(values["prometheusRule"]["ignoredXids"]) == telemetry_config.APPLICATION_XIDS


def test_monitoring_objects_only_when_asked_for() -> None:
    kinds = {m["kind"] for m in render("defaults").all()}

    assert not kinds & OPERATOR_KINDS


def test_the_bundled_nats_refuses_a_prefix_its_permissions_do_not_cover() -> None:
    with pytest.raises(helm.HelmError, match="written for the prefix gpuop"):
        render_with({"prefix": "cluster-b"})

    other = render_with({"prefix": "cluster-b", "nats": {"enabled": False, "external": {
        "address": "nats.shared:4222"}}})  # fmt: skip
    (_, container) = gpuop_containers(other)[0]
    assert environment(container, node="n")["GPUOP_PREFIX"] == "cluster-b"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"nats": {"tls": {"mode": "none"}}}, "nats.tls.mode must be auto, certManager"),
        ({"nats": {"tls": {"mode": "secret"}}}, "nats.tls.secretName is required"),
        ({"nats": {"enabled": False}}, "nats.external.address"),
        (
            {"nats": {"cluster": {"enabled": True, "antiAffinity": "soft"}}},
            'nats.cluster.antiAffinity must be required or preferred, not "soft"',
        ),
        (
            {"nats": {"enabled": False, "external": {"address": "n:4222", "replicas": 7}}},
            "nats.external.replicas must be 1 to 5",
        ),
    ],
)
def test_incomplete_nats_settings_fail_with_what_is_missing(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render_with(overrides)
