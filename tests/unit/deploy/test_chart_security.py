"""The chart's security settings (issue 17, findings 4 and 6), rendered by Helm: each node
agent mounts only the host paths its service reads and holds only the privileges it needs,
everything but the node agents meets Pod Security `restricted`, the services listen on their
pod's address behind NetworkPolicies, a Prometheus web-config reaches every service and the
ServiceMonitor follows it, and what holds a key to the cluster (the cluster roles, the callout,
the NATS servers) runs only on nodes an admin labelled, off GPU nodes."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from gpuop.host import modules, netdevs, nvidia, pci, system
from gpuop.inventory import scanning
from gpuop.kubelet import constants
from gpuop.runtime import settings
from gpuop.services.device_plugin import hcas, inventory
from gpuop.services.device_plugin.dra import deviceapis
from gpuop.services.device_plugin.dra import serving as dra_serving
from gpuop.services.network_manager import rdma
from gpuop.services.telemetry import config as telemetry_config
from tests.support.charts import (
    CHART,
    NAMESPACE,
    NODE_AGENTS,
    POD_IP,
    VALUES,
    Manifest,
    Rendering,
    containers,
    environment,
    gpuop_containers,
    gpuop_pods,
    image_user,
    render,
    render_with,
    served_in,
)
from tests.support.charts import values as values_of

pytestmark = pytest.mark.security

HOST_ROOT = "/host"
USERSPACE = "/opt/gpuop/gpu"
"""The driver's user space the driver-manager installs: NVML for the agents that read GPUs."""
SYSFS = {"/sys/bus": "Directory", "/sys/class": "Directory", "/sys/devices": "Directory"}
HOST_PATHS: dict[str, dict[str, tuple[str, bool]]] = {
    "discovery": {
        "/etc/os-release": ("File", False),
        "/proc/version": ("File", False),
        "/proc/uptime": ("File", False),
        "/proc/modules": ("File", False),
        "/proc/sys/kernel": ("Directory", False),
        "/proc/driver": ("Directory", False),
        "/sys/module": ("Directory", False),
        USERSPACE: ("DirectoryOrCreate", False),
        **{path: (kind, False) for path, kind in SYSFS.items()},
    },
    "device-plugin": {
        "/var/lib/kubelet/device-plugins": ("Directory", True),
        "/var/lib/kubelet/pod-resources": ("Directory", False),
        "/var/run/cdi": ("DirectoryOrCreate", True),
        "/var/lib/kubelet/plugins_registry": ("DirectoryOrCreate", True),
        "/var/lib/kubelet/plugins": ("DirectoryOrCreate", True),
        "/var/lib/gpuop/device-plugin": ("DirectoryOrCreate", True),
        "/proc/sys/kernel/random/boot_id": ("File", False),
        "/dev": ("Directory", False),
        "/proc/driver": ("Directory", False),
        "/sys/module": ("Directory", False),
        USERSPACE: ("DirectoryOrCreate", False),
        **{path: (kind, False) for path, kind in SYSFS.items()},
    },
    "network-manager": {path: (kind, False) for path, kind in SYSFS.items()},
    "telemetry": {
        "/var/lib/kubelet/pod-resources": ("Directory", False),
        "/sys/module": ("Directory", False),
        USERSPACE: ("DirectoryOrCreate", False),
    },
    "driver-manager": {"/": ("Directory", True)},
}
"""Per node agent: host path -> (hostPath type, written). The driver-manager alone has `/`."""
READS: dict[str, tuple[str, ...]] = {
    "discovery": (
        system.OS_RELEASE_FILES[0],
        system.OSRELEASE,
        system.PROC_VERSION,
        system.BOOT_ID,
        system.ARCH,
        system.UPTIME,
        modules.PROC_MODULES,
        modules.SYS_MODULE,
        nvidia.VERSION_FILE,
        nvidia.GPUS_DIR,
        pci.DEVICES,
        scanning.DMI_PRODUCT_NAME,
    ),
    "device-plugin": (
        constants.DEVICE_PLUGIN_DIR,
        constants.POD_RESOURCES_DIR,
        constants.CDI_SPEC_DIR,
        dra_serving.registration_socket(),
        dra_serving.plugin_socket(),
        deviceapis.FILE,
        system.BOOT_ID,
        *inventory.CONTROL_DEVICES,
        "proc/driver/nvidia/capabilities",
        pci.DEVICES,
        hcas.HCAS,
        hcas.VERBS,
        hcas.MADS,
        hcas.DEVICE_DIR,
    ),
    "network-manager": (netdevs.NET, pci.DEVICES, rdma.INFINIBAND),
    "telemetry": (str(telemetry_config.POD_RESOURCES_SOCKET),),
}
"""The host paths each service's code names (relative to the host root, as it reads them)."""
ROOT_AGENTS = {"driver-manager", "device-plugin", "telemetry", "network-manager"}
"""Node agents that must run as uid 0: the driver-manager (modules, reboot), the device
plugin and telemetry (the kubelet's root-owned sockets), the network-manager (capabilities
take effect for root only)."""
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
"""The volume types Pod Security `restricted` allows."""
WEB_CONFIG = {
    "metrics": {
        "webConfig": "metrics-web-config",
        "scheme": "https",
        "tlsConfig": {"ca": {"secret": {"name": "metrics-ca", "key": "ca.crt"}}},
        "basicAuth": {
            "username": {"name": "scraper", "key": "username"},
            "password": {"name": "scraper", "key": "password"},
        },
    },
    "serviceMonitor": {"enabled": True},
}


def pod_of(workload: Manifest) -> dict[str, Any]:
    pod: dict[str, Any] = workload["spec"]["template"]["spec"]
    return pod


def agents(rendering: Rendering) -> dict[str, Manifest]:
    return {d["metadata"]["name"].removeprefix("gpuop-"): d for d in rendering.all("DaemonSet")}


def host_paths(workload: Manifest) -> dict[str, tuple[str, bool, str]]:
    """host path -> (type, written, where the container sees it) of every hostPath volume."""
    pod = pod_of(workload)
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    found = {}
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            mount = mounts[volume["name"]]
            found[volume["hostPath"]["path"]] = (
                volume["hostPath"]["type"],
                not mount.get("readOnly", False),
                mount["mountPath"],
            )
    return found


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector with matchLabels and In/NotIn expressions selects `labels`."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        inside = labels.get(expression["key"]) in expression["values"]
        if inside is (expression["operator"] == "NotIn"):
            return False
    return True


def selected(rendering: Rendering, policy: Manifest) -> set[str]:
    return {
        workload["metadata"]["name"]
        for workload in rendering.workloads()
        if matches(
            policy["spec"]["podSelector"], workload["spec"]["template"]["metadata"]["labels"]
        )
    }


@pytest.mark.parametrize("values", VALUES)
def test_no_container_but_the_driver_managers_mounts_the_hosts_root(values: str) -> None:
    rendering = render(values)

    with_root = {
        workload["metadata"]["name"]
        for workload in rendering.workloads()
        for volume in pod_of(workload).get("volumes", [])
        if volume.get("hostPath", {}).get("path") == "/"
    }
    assert with_root == {"gpuop-driver-manager"}


@pytest.mark.parametrize("values", VALUES)
def test_each_node_agent_mounts_exactly_the_host_paths_its_service_reads(values: str) -> None:
    daemonsets = agents(render(values))

    assert set(daemonsets) == set(HOST_PATHS)
    for agent, daemonset in daemonsets.items():
        found = host_paths(daemonset)
        expected = {
            path: (kind, written, HOST_ROOT + path.rstrip("/"))
            for path, (kind, written) in HOST_PATHS[agent].items()
        }
        assert found == expected, agent


@pytest.mark.parametrize("agent", READS)
def test_every_host_path_a_service_reads_is_under_one_of_its_mounts(agent: str) -> None:
    mounted = [PurePosixPath(path) for path in HOST_PATHS[agent]]

    for read in READS[agent]:
        path = PurePosixPath("/") / read.lstrip("/")
        assert any(path.is_relative_to(mount) for mount in mounted), f"{agent} reads {path}"


@pytest.mark.parametrize("values", VALUES)
def test_only_the_driver_manager_is_privileged_and_its_template_says_why(values: str) -> None:
    privileged = {
        container["name"]
        for workload in render(values).workloads()
        for container in pod_of(workload)["containers"] + pod_of(workload).get("initContainers", [])
        if container.get("securityContext", {}).get("privileged")
    }

    assert privileged == {"driver-manager"}
    template = (CHART / "templates" / "node-agents.yaml").read_text()
    assert "The one privileged agent, and the one with the host's `/`" in template


@pytest.mark.parametrize("values", VALUES)
def test_node_agents_drop_every_capability_but_the_network_managers_net_admin(
    values: str,
) -> None:
    for agent, daemonset in agents(render(values)).items():
        pod = pod_of(daemonset)
        (container,) = pod["containers"]
        security = container["securityContext"]
        if agent == "driver-manager":
            assert security == {"privileged": True, "runAsUser": 0, "runAsGroup": 0}
            continue
        added = ["NET_ADMIN"] if agent == "network-manager" else None
        assert security["capabilities"].get("add") == added, agent
        assert security["capabilities"]["drop"] == ["ALL"], agent
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, agent
        assert security["allowPrivilegeEscalation"] is False, agent
        assert security["readOnlyRootFilesystem"] is True, agent
        if agent in ROOT_AGENTS:
            assert (security["runAsUser"], security.get("runAsNonRoot")) == (0, None), agent
        else:
            assert security["runAsNonRoot"] is True, agent
            assert security["runAsUser"] == image_user(), agent
    assert set(NODE_AGENTS) - ROOT_AGENTS == {"discovery"}


def restricted_violations(workload: Manifest) -> list[str]:
    """What keeps a pod from Pod Security `restricted` (the checks of the Kubernetes docs'
    Pod Security Standards, those that the chart's pods could fail)."""
    pod = pod_of(workload)
    found = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(flag)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {kinds}")
    pod_security = pod.get("securityContext", {})
    for container in pod["containers"] + pod.get("initContainers", []):
        security = container.get("securityContext", {})
        name = container["name"]
        if security.get("privileged"):
            found.append(f"{name}: privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation")
        if not security.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot")
        if security.get("runAsUser", pod_security.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = security.get("seccompProfile", pod_security.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile")
        capabilities = security.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities not dropped")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities added")
    return found


@pytest.mark.parametrize("values", VALUES)
def test_every_pod_but_the_node_agents_meets_pod_security_restricted(values: str) -> None:
    rendering = render(values)
    checked = 0

    for workload in rendering.workloads():
        if workload["kind"] == "DaemonSet":
            assert restricted_violations(workload), workload["metadata"]["name"]
            continue
        assert restricted_violations(workload) == [], workload["metadata"]["name"]
        checked += 1
    assert checked >= 4


def test_the_namespace_the_chart_can_make_enforces_privileged_and_audits_restricted() -> None:
    (namespace,) = render("all-features").all("Namespace")

    assert namespace["metadata"]["name"] == NAMESPACE
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert "pod-security.kubernetes.io/warn" not in labels
    assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert render("defaults").all("Namespace") == []


@pytest.mark.parametrize("values", VALUES)
def test_every_service_binds_its_metrics_to_its_pods_ip(values: str) -> None:
    for _, container in gpuop_containers(render(values)):
        port = container["ports"][0]["containerPort"]
        names = [variable["name"] for variable in container["env"]]
        pod_ip = next(v for v in container["env"] if v["name"] == "POD_IP")
        listen = next(v for v in container["env"] if v["name"] == "GPUOP_METRICS_LISTEN")

        assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert names.index("POD_IP") < names.index("GPUOP_METRICS_LISTEN")
        assert listen["value"] == f"$(POD_IP):{port}"
        loaded = settings.load({"service": container["args"][1]}, environment(container, node="n"))
        assert loaded.listen_address == (POD_IP, port)


def test_metrics_listen_takes_ipv6_pod_addresses_and_every_address_when_asked() -> None:
    ipv6 = gpuop_containers(render_with({"metrics": {"listen": "podIPv6"}}))
    everywhere = gpuop_containers(render_with({"metrics": {"listen": "all"}}))

    for (_, six), (_, every) in zip(ipv6, everywhere, strict=True):
        port = six["ports"][0]["containerPort"]
        values = {v["name"]: v.get("value") for v in six["env"]}
        assert values["GPUOP_METRICS_LISTEN"] == f"[$(POD_IP)]:{port}"
        assert {v["name"]: v.get("value") for v in every["env"]}["GPUOP_METRICS_LISTEN"] == (
            f"0.0.0.0:{port}"
        )
    with pytest.raises(
        helm.HelmError, match=re.escape("metrics.listen must be podIP, podIPv6 or all")
    ):
        render_with({"metrics": {"listen": "localhost"}})


@pytest.mark.parametrize("values", VALUES)
def test_the_metrics_policy_lets_only_prometheus_reach_every_services_metrics_port(
    values: str,
) -> None:
    rendering = render(values)
    policy = rendering.get("NetworkPolicy", "gpuop-metrics")
    services = gpuop_pods(rendering)
    # a hostNetwork pod's port is the node's, which no NetworkPolicy guards
    ports = {
        c["ports"][0]["containerPort"]
        for w, c in containers(rendering)
        if w["metadata"]["name"] in services and not pod_of(w).get("hostNetwork")
    }
    (rule,) = policy["spec"]["ingress"]
    expected_from = (values_of(values) or {}).get("networkPolicy", {}).get("metricsFrom")

    assert selected(rendering, policy) == services
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert {p["port"] for p in rule["ports"]} == ports
    assert {p["protocol"] for p in rule["ports"]} == {"TCP"}
    if expected_from is None:
        (peer,) = rule["from"]
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "monitoring"
        }
        assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    else:
        assert rule["from"] == expected_from


def test_nats_takes_clients_from_gpuops_pods_and_the_nodes_and_routes_from_its_servers() -> None:
    rendering = render("nats-cluster")
    policy = rendering.get("NetworkPolicy", "gpuop-nats")
    clients, routes = policy["spec"]["ingress"]

    assert selected(rendering, policy) == {"gpuop-nats"}
    assert clients["ports"] == [{"protocol": "TCP", "port": 4222}]
    pods, *nodes = clients["from"]
    services = gpuop_pods(rendering)
    assert {
        w["metadata"]["name"]
        for w in rendering.workloads()
        if matches(pods["podSelector"], w["spec"]["template"]["metadata"]["labels"])
    } == services
    # the hostNetwork network-manager connects from its node; no node CIDRs given: any
    assert nodes == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    assert routes["ports"] == [{"protocol": "TCP", "port": 6222}]
    (servers,) = routes["from"]
    nats = rendering.get("StatefulSet", "gpuop-nats")["spec"]["template"]["metadata"]["labels"]
    assert matches(servers["podSelector"], nats)
    assert not any(
        matches(servers["podSelector"], w["spec"]["template"]["metadata"]["labels"])
        for w, _ in gpuop_containers(rendering)
    )


def test_node_cidrs_narrow_the_nats_client_port_and_no_network_manager_needs_none() -> None:
    narrowed = render("all-features").get("NetworkPolicy", "gpuop-nats")
    without = render_with({"networkManager": {"enabled": False}}).get("NetworkPolicy", "gpuop-nats")
    single = render("defaults").get("NetworkPolicy", "gpuop-nats")

    (clients,) = narrowed["spec"]["ingress"]
    assert [p.get("ipBlock", {}).get("cidr") for p in clients["from"][1:]] == [
        "10.0.0.0/16",
        "fd00:10::/64",
    ]
    (clients,) = without["spec"]["ingress"]
    assert [p for p in clients["from"] if "ipBlock" in p] == []
    assert len(single["spec"]["ingress"]) == 1  # no cluster routes for a single server


def test_network_policies_only_when_enabled_and_none_for_an_external_nats() -> None:
    off = render_with({"networkPolicy": {"enabled": False}})
    external = render("external-nats")

    assert off.all("NetworkPolicy") == []
    assert [p["metadata"]["name"] for p in external.all("NetworkPolicy")] == ["gpuop-metrics"]


def test_a_web_config_reaches_every_service_and_the_service_monitor_follows_it() -> None:
    rendering = render_with(WEB_CONFIG)
    for version in ("1.27", kubernetes_validate.latest_version()):
        for manifest in rendering.all():
            operator = manifest["kind"] in ("ServiceMonitor", "PrometheusRule")
            if not operator and served_in(manifest, version):
                kubernetes_validate.validate(manifest, version, strict=True)

    for workload, container in gpuop_containers(rendering):
        mount = next(m for m in container["volumeMounts"] if m["name"] == "web-config")
        volume = next(v for v in pod_of(workload)["volumes"] if v["name"] == "web-config")
        loaded = settings.load({"service": container["args"][1]}, environment(container, node="n"))

        assert mount == {
            "name": "web-config",
            "mountPath": "/etc/gpuop/web-config",
            "readOnly": True,
        }
        assert volume["secret"]["secretName"] == "metrics-web-config"
        assert volume["secret"]["items"] == [{"key": "web-config.yml", "path": "web-config.yml"}]
        assert str(loaded.metrics_web_config) == "/etc/gpuop/web-config/web-config.yml"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    (monitor,) = rendering.all("ServiceMonitor")
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"] == WEB_CONFIG["metrics"]["tlsConfig"]
        assert endpoint["basicAuth"] == WEB_CONFIG["metrics"]["basicAuth"]


def test_without_a_web_config_the_services_serve_plain_http() -> None:
    rendering = render_with({"serviceMonitor": {"enabled": True}})

    for workload, container in gpuop_containers(rendering):
        assert "web-config" not in {v["name"] for v in pod_of(workload)["volumes"]}
        assert "GPUOP_METRICS_WEB_CONFIG" not in {v["name"] for v in container["env"]}
        assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
    (monitor,) = rendering.all("ServiceMonitor")
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["scheme"] == "http"
        assert "tlsConfig" not in endpoint
        assert "basicAuth" not in endpoint
    with pytest.raises(
        helm.HelmError, match=re.escape("metrics.scheme https needs metrics.webConfig")
    ):
        render_with({"metrics": {"scheme": "https"}})


ADMINS_LABEL = {
    "key": "node-restriction.kubernetes.io/gpuop-control-plane",
    "operator": "In",
    "values": ["true"],
}
"""The label that makes a node eligible for what holds a key: the NodeRestriction admission
plugin refuses it to kubelets (tests/integration/real_cluster/test_chart_placement_real.py)."""
OFF_GPU_NODES = {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}


def required_node_terms(workload: Manifest) -> list[dict[str, Any]]:
    affinity = pod_of(workload).get("affinity", {}).get("nodeAffinity", {})
    terms: list[dict[str, Any]] = affinity.get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    ).get("nodeSelectorTerms", [])
    return terms


@pytest.mark.parametrize("values", VALUES)
def test_what_holds_a_key_runs_only_on_nodes_admins_labelled_and_the_node_agents_anywhere(
    values: str,
) -> None:
    """Every workload kind: the cluster roles, the callout (Deployments) and the NATS servers
    (a StatefulSet) need the admins' label and avoid GPU nodes; the node agents (DaemonSets)
    go wherever their node selector says."""
    rendering = render(values)
    kinds = {workload["kind"] for workload in rendering.workloads()}
    assert kinds == {"DaemonSet", "Deployment"} | (
        set() if values == "external-nats" else {"StatefulSet"}
    ), kinds

    rows = []
    for workload in rendering.workloads():
        name = f"{workload['kind']} {workload['metadata']['name']}"
        terms = required_node_terms(workload)
        expressions = terms[0]["matchExpressions"] if terms else []
        where = [f"{e['key']} {e['operator']} {','.join(e.get('values', []))}" for e in expressions]
        rows.append((name, " and ".join(where) or "anywhere"))
        if workload["kind"] == "DaemonSet":
            assert "affinity" not in pod_of(workload), name
            continue
        (term,) = terms
        assert term["matchExpressions"] == [ADMINS_LABEL, OFF_GPU_NODES], name
    assert "Deployment gpuop-device-plugin-cluster" in dict(rows)
    print(f"\nplacement ({values}):")
    for name, where in rows:
        print(f"  {name:<38} {where}")
    orchestrator = pod_of(rendering.get("Deployment", "gpuop-upgrade-orchestrator"))
    assert "podAntiAffinity" in orchestrator["affinity"]
    if values == "nats-cluster":
        assert "podAntiAffinity" in pod_of(rendering.get("StatefulSet", "gpuop-nats"))["affinity"]


def test_where_what_holds_a_key_runs_is_configurable() -> None:
    anywhere = render_with({"clusterRoles": {"avoidNodes": [], "nodeLabel": {"key": ""}}})
    tainted = render_with(
        {
            "clusterRoles": {
                "avoidNodes": [{"key": "example.com/gpu", "operator": "DoesNotExist"}],
                "nodeLabel": {"key": "node-role.kubernetes.io/control-plane", "values": [""]},
            }
        }
    )

    for kind, name in (("Deployment", "gpuop-discovery-cluster"), ("StatefulSet", "gpuop-nats")):
        assert "affinity" not in pod_of(anywhere.get(kind, name)), name
    orchestrator = pod_of(anywhere.get("Deployment", "gpuop-upgrade-orchestrator"))
    assert set(orchestrator["affinity"]) == {"podAntiAffinity"}
    for kind, name in (("Deployment", "gpuop-telemetry-cluster"), ("StatefulSet", "gpuop-nats")):
        (term,) = required_node_terms(tainted.get(kind, name))
        assert term["matchExpressions"] == [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "In", "values": [""]},
            {"key": "example.com/gpu", "operator": "DoesNotExist"},
        ], name


@pytest.mark.parametrize("key", ["nvidia.com/gpu.present", "example.com/control-plane"])
def test_a_node_label_a_kubelet_may_set_itself_is_refused(key: str) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(f'clusterRoles.nodeLabel.key "{key}"')):
        render_with({"clusterRoles": {"nodeLabel": {"key": key}}})
