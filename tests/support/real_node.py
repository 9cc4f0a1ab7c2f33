"""A real Kubernetes node as local processes, registered with the real control plane
(`tests.support.control_plane`): containerd 2.x with Debian's runc, the kubelet, kube-proxy
and a cluster DNS (CoreDNS), built from their Go modules by `make cluster-tools`
(tests/cluster/build-tools.sh). Nothing is downloaded at run time: the sandbox and test
images are made here from Debian's static busybox (`tests.support.tiny_images`).

Everything lives in one work directory: containerd's root, state and socket; the node's host
root (`host/`), whose `etc/containerd/config.toml` containerd runs with and where gpuop's own
runtime drop-in (`gpuop.host.runtimes`, the `nvidia` handler with CDI) is written; the
kubelet's root, certificates and pod logs; the CNI config and its address leases; each
component's log. Each component runs in its own process group and is stopped in reverse
start order, SIGKILL after a grace.

Nothing leaves the machine. The node's address (`NODE_IP`) sits on a bridge the launcher
creates with no ports; the pods' addresses (`POD_SUBNET`) live in the network namespaces the
CNI bridge plugin makes, with routes to the Service range and the node only (no default
route). The kubelet's `resolvConf` names only the cluster DNS, which answers the cluster
domain from the apiserver and forwards nowhere (it is built without a forward plugin).

One real node per machine at a time (kube-proxy owns the host's KUBE-* chains): `start`
waits for a lock file. `stop` leaves nothing behind: pod sandboxes removed (their network
namespaces and veths with them), kube-proxy's chains cleaned, every mount under the work
directory unmounted (the kubelet's pod volumes, containerd's snapshots), the bridges
deleted, the kubelet's cgroups removed, the directories it makes outside its root dir
removed when they were not there before, and the three kernel settings the kubelet changes
put back. `leftovers()` says what would remain.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpuop.host import devnodes, runtimes, system
from gpuop.host.roots import HostRoot
from gpuop_sim.cluster import hosts
from gpuop_sim.host import seeding
from tests.support import cdi, control_plane, tiny_images
from tests.support.control_plane import (
    SERVICE_CIDR,
    Component,
    ControlPlane,
    ControlPlaneError,
    Launcher,
    binary,
    kubeconfig,
)
from tests.support.processes import free_port
from tests.support.relays import Relay

NAME = "gpuop-real-node"
NODE_BRIDGE = "gpuop-node0"
NODE_IP = "10.199.0.1"
"""The node's InternalIP, on `NODE_BRIDGE`. Not 192.0.2.x: this machine's own uplink is
192.0.2.2/24."""
POD_BRIDGE = "gpuop-cni0"
POD_SUBNET = "10.199.1.0/24"
POD_GATEWAY = "10.199.1.1"
CLUSTER_DNS = "10.96.0.10"
NO_REGISTRY = "http://127.0.0.1:9"
"""Where containerd's pulls go, for every registry: nothing listens there, and no name is
looked up (a pull of `gpuop.invalid/...` would otherwise ask the host's resolver)."""
CLUSTER_DOMAIN = "cluster.local"
RUNC = Path("/usr/sbin/runc")
"""Debian's runc (package `runc`): the pinned Go module needs cgo and libseccomp."""
BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "crictl",
    "coredns",
    "cni/bridge",
    "cni/host-local",
    "cni/loopback",
    "cni/portmap",
)
DEBIAN_TOOLS = {"runc": "runc", "iptables": "iptables", "busybox": "busybox-static"}
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
"""The kernel settings the kubelet sets at start (and will not run without)."""
LOCK = Path("/run/lock/gpuop-real-node.lock")
HOST_DROP_INS = Path("/etc/containerd/conf.d/*.toml")
"""containerd 2.4 adds this to every config's imports (`config dump` shows it)."""
SHIM_SOCKETS = Path("/run/gpuop-real-node")
"""The runc shims' sockets: a socket path holds 107 bytes and the shim's name is 64 of them,
so not under the work directory. Safe to share: one real node per machine (`LOCK`)."""
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
"""The kubelet's device-plugin directory: its registration socket and the plugins' sockets,
here whatever its `--root-dir` (upstream's `DevicePluginPath`)."""
DRIVER_FILES = Path("/opt/gpuop")
"""Where a GPU node's CDI spec names the driver's user space on the host: the host root's
`opt/gpuop`, bind-mounted here while the node runs."""
OUTSIDE = (
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/containers",
    "/var/log/pods",
    "/run/containerd",
    "/run/mount",
    "/usr/libexec/kubernetes",
    str(SHIM_SOCKETS),
    str(DRIVER_FILES),
)
"""Paths the kubelet, containerd and the CNI library write whatever their roots say (the
device plugins' registration socket, CNI's result cache); removed at stop unless they were
there before."""
START_TIMEOUT = 120.0
CONTAINERD_DISABLED = (
    "io.containerd.internal.v1.opt",
    "io.containerd.image-verifier.v1.bindir",
    "io.containerd.nri.v1.nri",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.snapshotter.v1.erofs",
)


def device_nodes(gpus: int) -> dict[str, tuple[int, int]]:
    """The character devices of NVIDIA's driver for `gpus` GPUs, by name under /dev: one
    per GPU (major 195), and the control nodes the driver-manager makes after a load
    (`gpuop.host.devnodes`): the control device and modeset's (195), the unified memory pair
    (the simulated kernel's dynamic major, 235). Made for real on the node's host root;
    nothing answers behind them."""
    nodes = gpu_nodes(gpus)
    nodes["nvidiactl"] = (195, 255)
    nodes["nvidia-modeset"] = (195, 254)
    nodes["nvidia-uvm"] = (235, 0)
    nodes["nvidia-uvm-tools"] = (235, 1)
    return nodes


def gpu_nodes(gpus: int) -> dict[str, tuple[int, int]]:
    """`/dev/nvidia<minor>` of each GPU: made when a program first opens it (nvidia-modprobe)
    or by udev; the launcher makes them."""
    return {f"nvidia{index}": (195, index) for index in range(gpus)}


class RealNodeError(ControlPlaneError):
    """The real node could not start (or stop clean); the message says why and where."""


def missing() -> list[str]:
    """What the real node needs and this machine lacks: tools to build, packages to install."""
    absent = [
        f"{name} (make cluster-tools)"
        for name in BINARIES
        if not os.access(control_plane.BIN / name, os.X_OK)
    ]
    for tool, package in DEBIAN_TOOLS.items():
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            absent.append(f"{tool} (apt-get install {package})")
    if os.geteuid() != 0:
        absent.append("root")
    return absent


@dataclass
class RealNode(Launcher):
    """The node `name` in `work`, registered with `plane`: `with RealNode(plane, work) as node`."""

    plane: ControlPlane
    work: Path
    name: str = NAME
    gpus: int = 0
    """With GPUs, the host root is a simulated GPU node's (`gpuop sim host`: the recorded H200
    node, its driver loaded) with its NVIDIA device nodes made for real (`DEVICE_NODES`)."""
    components: list[Component] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    _before: dict[str, Any] = field(default_factory=dict)
    _lock: TextIO | None = None
    _kube_proxy_config: Path | None = None
    _relay: Relay | None = None

    # Paths.

    @property
    def host_root(self) -> Path:
        """The node's `/` for gpuop (`gpuop.host.roots.HostRoot`): its containerd config,
        gpuop's drop-in, the CDI spec directory."""
        return self.work / "host"

    @property
    def cdi_dir(self) -> Path:
        return self.host_root / "var/run/cdi"

    @property
    def socket(self) -> Path:
        return self.work / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.work / "kubelet"

    @property
    def containerd_config(self) -> Path:
        return self.host_root / runtimes.CONTAINERD_CONFIG

    # Lifecycle.

    def start(self) -> None:
        absent = missing()
        if absent:
            raise RealNodeError("the real node needs: " + ", ".join(absent))
        host_drop_ins = sorted(HOST_DROP_INS.parent.glob(HOST_DROP_INS.name))
        if host_drop_ins:
            raise RealNodeError(
                f"containerd 2.x imports {HOST_DROP_INS} whatever its config says, and this "
                f"machine has {', '.join(map(str, host_drop_ins))}: move them away first"
            )
        self.work.mkdir(parents=True, exist_ok=True)
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = LOCK.open("w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # one real node per machine
        self._before = {
            "sysctls": {name: _sysctl(name) for name in KUBELET_SYSCTLS},
            "outside": [path for path in OUTSIDE if os.path.lexists(path)],
            "chains": _chains(),
        }
        for name in (
            "kubelet",
            "kubelet-healthz",
            "kube-proxy-healthz",
            "kube-proxy-metrics",
            "coredns-ready",
        ):
            self.ports[name] = free_port()
        self._host_root()
        self._network()
        self._relay_apiserver()
        self._start_containerd()
        self._import_images()
        self._start_dns()
        self._start_kubelet()
        # kube-proxy once the Node has its address: it restarts itself when the node's
        # addresses change, and waits 30 s for a Node that is not there yet
        self._until(f"node {self.name} registered", self._registered)
        self._start_kube_proxy()
        self.wait_ready()

    def _env(self) -> dict[str, str]:
        """containerd finds its shim on PATH; runc, iptables and mount are Debian's."""
        path = f"{control_plane.BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"PATH": path, "HOME": str(self.work), "LANG": "C.UTF-8"}

    def _host_root(self) -> None:
        if self.gpus == 0:
            self.host_root.mkdir(parents=True, exist_ok=True)
            return
        root = hosts.build_host_root(self.host_root, self.name, self.gpus)
        devices = self.host_root / "dev"
        devices.mkdir(exist_ok=True)
        for name, (major, minor) in gpu_nodes(self.gpus).items():
            os.mknod(devices / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        devnodes.create(root)  # the driver-manager's step after every load
        # the kubelet's device-plugin directory is /var/lib/kubelet/device-plugins whatever
        # its root dir; a plugin finds it under the host root, as the chart mounts it there
        kubelet = self.host_root / "var/lib/kubelet"
        kubelet.mkdir(parents=True, exist_ok=True)
        (kubelet / "device-plugins").symlink_to(DEVICE_PLUGINS)
        (kubelet / "pod-resources").symlink_to(self.kubelet_root / "pod-resources")
        self._user_space(root)
        self._chart_paths()

    def _user_space(self, root: HostRoot) -> None:
        """The recorded driver's user space installed and in use, as the driver-manager's
        installer and load leave it (`opt/gpuop/gpu/<version>`), and seen by the runtime at
        the host's `/opt/gpuop`, where the CDI spec's mounts name it (on a real node the host
        root is `/`): a bind mount, made only where this machine has no /opt/gpuop."""
        version = seeding.RECORDED_DRIVER_VERSION
        kernel_release = system.kernel_release(root)
        if version is None or kernel_release is None:
            raise RealNodeError(f"{self.host_root}: no driver or kernel to install for")
        cdi.install_userspace(root, cdi.manifest(version, kernel_release))
        if os.path.lexists(DRIVER_FILES):
            raise RealNodeError(f"{DRIVER_FILES} exists: the node's driver would not be seen")
        DRIVER_FILES.mkdir(parents=True)
        _run("mount", "--bind", "-o", "ro", str(self.host_root / "opt/gpuop"), str(DRIVER_FILES))

    def _chart_paths(self) -> None:
        """What the chart's node agents mount from the host root (`nodeAgents.hostRoot`) and
        a simulated one lacks: the machine's os-release, an uptime, /sys/devices. The host
        root is a shared mount of its own, as `/` is on a systemd host: the driver-manager
        mounts it with HostToContainer propagation, which needs a shared (or slave) mount;
        stop unmounts it with the rest under the work directory."""
        root = self.host_root
        (root / "etc").mkdir(exist_ok=True)
        shutil.copy("/etc/os-release", root / "etc/os-release")
        (root / "proc/uptime").write_text("1000.00 1000.00\n", encoding="utf-8")
        (root / "sys/devices").mkdir(exist_ok=True)
        _run("mount", "--bind", str(root), str(root))
        _run("mount", "--make-rshared", str(root))

    # The node's addresses: a bridge with no ports holds the node IP.

    def _network(self) -> None:
        for link in (POD_BRIDGE, NODE_BRIDGE):  # a killed run's (this node holds the lock)
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        _run("ip", "link", "add", NODE_BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NODE_IP}/32", "dev", NODE_BRIDGE)
        _run("ip", "link", "set", NODE_BRIDGE, "up")
        net = self.work / "cni" / "net.d"
        net.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "gpuop-real-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": POD_BRIDGE,
                    "isGateway": True,
                    "isDefaultGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.work / "cni" / "leases"),
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                        # the Service range and the node, nothing else: no default route
                        "routes": [{"dst": SERVICE_CIDR}, {"dst": f"{NODE_IP}/32"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (net / "10-gpuop-real-node.conflist").write_text(json.dumps(conflist, indent=2))

    def _relay_apiserver(self) -> None:
        """The apiserver at the node's address, where a plane advertising it (`ControlPlane(
        advertise=NODE_IP)`) sends the `kubernetes` Service: pods reach it there."""
        if self.plane.advertise != NODE_IP:
            return
        port = self.plane.ports["apiserver"]
        self._relay = Relay((NODE_IP, port), ("127.0.0.1", port))
        self._relay.start()

    # containerd.

    def _start_containerd(self) -> None:
        work = self.work / "containerd"
        (work / "root").mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        self.containerd_config.parent.mkdir(parents=True, exist_ok=True)
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        self.containerd_config.write_text(
            f"""\
version = 3
root = {_toml(work / "root")}
state = {_toml(work / "state")}
imports = ["conf.d/*.toml"]
disabled_plugins = [{", ".join(_toml(p) for p in CONTAINERD_DISABLED)}]

[grpc]
  address = {_toml(self.socket)}
[ttrpc]
  address = {_toml(str(self.socket) + ".ttrpc")}
[debug]
  address = ""

[{runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {_toml(RUNC)}
  Root = {_toml(work / "runc")}
  SystemdCgroup = false
[{runtime}.cni]
  bin_dirs = [{_toml(control_plane.BIN / "cni")}]
  conf_dir = {_toml(self.work / "cni" / "net.d")}
  max_conf_num = 1

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = {_toml(work / "hosts")}
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {_toml(tiny_images.PAUSE)}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = {_toml(SHIM_SOCKETS)}
""",
            encoding="utf-8",
        )
        # every registry is one that refuses at once: a pull never looks a name up
        (work / "hosts" / "_default").mkdir(parents=True, exist_ok=True)
        (work / "hosts" / "_default" / "hosts.toml").write_text(
            f'server = "{NO_REGISTRY}"\n', encoding="utf-8"
        )
        # gpuop's own drop-in, as the driver-manager writes it on a node: the `nvidia`
        # handler with CDI. It names the host's /etc/cdi and /var/run/cdi; this node's CDI
        # specs live under its host root, which the last drop-in says.
        root = HostRoot(self.host_root)
        runtimes.apply(root, runtimes.plan(root, runtimes.Runtime.CONTAINERD))
        (self.containerd_config.parent / "conf.d" / "zz-real-node.toml").write_text(
            f"version = 3\n[{runtime}]\n  cdi_spec_dirs = [{_toml(self.cdi_dir)}]\n",
            encoding="utf-8",
        )
        self._spawn(
            "containerd",
            [
                str(binary("containerd")),
                f"--config={self.containerd_config}",
                f"--address={self.socket}",
            ],
            env=self._env(),
        )
        self._until("containerd answers", lambda: self.ctr("version", check=False).returncode == 0)

    def ctr(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`ctr` on this node's containerd, in the kubelet's namespace `k8s.io`."""
        return subprocess.run(
            [str(binary("ctr")), f"--address={self.socket}", "--namespace=k8s.io", *arguments],
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
            env=self._env(),
        )

    def crictl(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        endpoint = f"unix://{self.socket}"
        return subprocess.run(
            [
                str(binary("crictl")),
                f"--runtime-endpoint={endpoint}",
                f"--image-endpoint={endpoint}",
                "--timeout=60s",
                *arguments,
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=check,
            env=self._env(),
        )

    def import_archive(self, archive: Path) -> None:
        """An OCI image layout tarball into the kubelet's image namespace."""
        self.ctr("images", "import", "--snapshotter=overlayfs", str(archive))

    def _import_images(self) -> None:
        self.import_archive(tiny_images.write_archive(self.work / "busybox-images.tar"))

    # Cluster DNS: CoreDNS on the node IP, the Service kube-dns in front of it.

    def _start_dns(self) -> None:
        corefile = self.work / "Corefile"
        admin = self.plane.admin_kubeconfig
        corefile.write_text(
            f"""\
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {NODE_IP}
    ready 127.0.0.1:{self.ports["coredns-ready"]}
    errors
    log
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {admin}
        pods insecure
    }}
    cache 30
}}
""",
            encoding="utf-8",
        )
        self._apply_dns_service()
        self._spawn("coredns", [str(binary("coredns")), "-conf", str(corefile)], env=self._env())
        url = f"http://127.0.0.1:{self.ports['coredns-ready']}/ready"
        self._until("CoreDNS ready", lambda: _http_ok(url))

    def _apply_dns_service(self) -> None:
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kube-dns",
                "namespace": "kube-system",
                "labels": {"k8s-app": "kube-dns"},
            },
            "spec": {
                "clusterIP": CLUSTER_DNS,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                ],
            },
        }
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-real-node",
                "namespace": "kube-system",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "gpuop-real-node",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        }
        self._create("/api/v1/namespaces/kube-system/services", service)
        self._create("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", slice_)

    def _create(self, path: str, body: dict[str, Any]) -> None:
        status, answer = self.plane.request(path, method="POST", body=body)
        if status not in (201, 409):
            raise RealNodeError(f"POST {path}: {status} {answer.decode(errors='replace')}")

    # kube-proxy (iptables) and the kubelet.

    def _client_kubeconfig(self, name: str, user: str, group: str) -> Path:
        authority = self.plane.pki.authority()
        certificate, key = authority.sign(user, client=True, organisation=group)
        path = self.work / f"{name}.kubeconfig"
        credentials = {"client-certificate-data": _b64(certificate), "client-key-data": _b64(key)}
        path.write_text(
            yaml.safe_dump(kubeconfig(self.plane.url, self.plane.pki.ca, user, credentials)),
            encoding="utf-8",
        )
        return path

    def _start_kube_proxy(self) -> None:
        config = self.work / "kube-proxy.yaml"
        access = self._client_kubeconfig("kube-proxy", "system:kube-proxy", "gpuop-real-node")
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(access)},
                    "hostnameOverride": self.name,
                    "bindAddress": NODE_IP,
                    "mode": "iptables",
                    "clusterCIDR": POD_SUBNET,
                    "nodePortAddresses": [f"{NODE_IP}/32"],
                    "healthzBindAddress": f"127.0.0.1:{self.ports['kube-proxy-healthz']}",
                    "metricsBindAddress": f"127.0.0.1:{self.ports['kube-proxy-metrics']}",
                    "oomScoreAdj": 0,
                    # leave the host's conntrack settings alone
                    "conntrack": {
                        "maxPerCore": 0,
                        "min": 0,
                        "tcpEstablishedTimeout": "0s",
                        "tcpCloseWaitTimeout": "0s",
                    },
                    "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
                }
            ),
            encoding="utf-8",
        )
        self._kube_proxy_config = config
        self._spawn(
            "kube-proxy",
            [str(binary("kube-proxy")), f"--config={config}", "--v=1"],
            env=self._env(),
        )
        url = f"http://127.0.0.1:{self.ports['kube-proxy-healthz']}/healthz"
        self._until("kube-proxy healthy", lambda: _http_ok(url, any_status=True))

    def _start_kubelet(self) -> None:
        pki = self.kubelet_root / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        authority = self.plane.pki.authority()
        serving, serving_key = authority.sign(self.name, hosts=(self.name, NODE_IP))
        (pki / "kubelet.crt").write_bytes(serving)
        (pki / "kubelet.key").write_bytes(serving_key)
        access = self._client_kubeconfig("kubelet", f"system:node:{self.name}", "system:nodes")
        resolv = self.work / "resolv.conf"
        resolv.write_text(f"nameserver {NODE_IP}\nsearch {CLUSTER_DOMAIN}\n", encoding="utf-8")
        config = self.work / "kubelet.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "failCgroupV1": False,  # this machine's hierarchy is cgroup v1
                    "cgroupDriver": "cgroupfs",
                    "failSwapOn": False,
                    "protectKernelDefaults": False,
                    "oomScoreAdj": 0,
                    "containerRuntimeEndpoint": f"unix://{self.socket}",
                    "address": NODE_IP,
                    "port": self.ports["kubelet"],
                    "readOnlyPort": 0,
                    "healthzBindAddress": "127.0.0.1",
                    "healthzPort": self.ports["kubelet-healthz"],
                    "tlsCertFile": str(pki / "kubelet.crt"),
                    "tlsPrivateKeyFile": str(pki / "kubelet.key"),
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": True},
                        "x509": {"clientCAFile": str(self.plane.pki.ca)},
                    },
                    "authorization": {"mode": "Webhook"},
                    "podLogsDir": str(self.work / "pod-logs"),
                    "volumePluginDir": str(self.work / "volume-plugins"),
                    "resolvConf": str(resolv),
                    "clusterDNS": [CLUSTER_DNS],
                    "clusterDomain": CLUSTER_DOMAIN,
                    "maxPods": 32,
                    # the host's disk is shared with everything else: never evict for it here
                    "evictionHard": {
                        "memory.available": "1Mi",
                        "nodefs.available": "1%",
                        "imagefs.available": "1%",
                        "nodefs.inodesFree": "1%",
                    },
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "shutdownGracePeriod": "0s",
                    "rotateCertificates": False,
                    "serverTLSBootstrap": False,
                }
            ),
            encoding="utf-8",
        )
        self._spawn(
            "kubelet",
            [
                str(binary("kubelet")),
                f"--config={config}",
                f"--kubeconfig={access}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={pki}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
                "--node-labels=gpuop.io/real-node=true",
                "--v=1",
            ],
            env=self._env(),
        )

    def restart_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM, as its service manager does) and start it again with the
        same configuration, until the node is Ready again. Its containers keep running."""
        self._stop_named("kubelet")
        self._start_kubelet()
        self.wait_ready()

    # Waiting.

    def _until(self, what: str, ready: Any, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_running()
            if ready():
                return
            time.sleep(0.25)
        raise RealNodeError(f"{what}: not within {timeout:g} s\n{self.report()}")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until the Node object reports Ready."""
        self._until(f"node {self.name} Ready", self.ready, timeout)

    def _registered(self) -> bool:
        status, body = self.plane.request(f"/api/v1/nodes/{self.name}")
        return status == 200 and bool(json.loads(body).get("status", {}).get("addresses"))

    def ready(self) -> bool:
        status, body = self.plane.request(f"/api/v1/nodes/{self.name}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # Stopping.

    def stop(self) -> None:
        """The kubelet first (it stops nothing it runs), then every pod sandbox through the
        CRI while containerd still runs (the CNI tears down each pod's network), then
        kube-proxy and its chains, the DNS, containerd; then what they left. Nothing when
        `start` refused before touching the machine."""
        if self._lock is None:
            return
        try:
            if self._relay is not None:
                self._relay.stop()
                self._relay = None
            self._stop_named("kubelet")
            if self._component("containerd") is not None:
                with suppress(subprocess.SubprocessError, OSError):
                    self.crictl("rmp", "--all", "--force", check=False)
            self._stop_named("kube-proxy")
            if self._kube_proxy_config is not None:
                subprocess.run(
                    [str(_bin("kube-proxy")), "--cleanup", f"--config={self._kube_proxy_config}"],
                    capture_output=True,
                    timeout=60,
                    check=False,
                    env=self._env(),
                )
            self._stop_named("coredns")
            self._stop_named("containerd")
            super().stop()
            self._kill_shims()
            self._cleanup()
            self._forget_in_cluster()
        finally:
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    def _component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def _stop_named(self, name: str) -> None:
        component = self._component(name)
        if component is not None:
            self._stop_component(component)

    def _kill_shims(self) -> None:
        """runc shims this node's containerd started (they outlive it by design)."""
        mark = str(self.socket).encode()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with suppress(OSError):
                if mark in cmdline.read_bytes():
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)

    def _cleanup(self) -> None:
        for point in sorted(_mounts_under(self.work), key=len, reverse=True):
            _unmount(point)
        for link in (POD_BRIDGE, NODE_BRIDGE):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        before = self._before.get("chains")
        if before is not None:
            _drop_chains(_chains() - before)
        _remove_cgroups()
        for path in OUTSIDE:
            if path not in self._before.get("outside", OUTSIDE):
                for point in sorted(_mounts_under(Path(path)), key=len, reverse=True):
                    _unmount(point)
                shutil.rmtree(path, ignore_errors=True)
        for name, value in self._before.get("sysctls", {}).items():
            if value is not None:
                with suppress(OSError):
                    Path("/proc/sys", name).write_text(value)

    def _forget_in_cluster(self) -> None:
        """The Node and the DNS Service, so the control plane can take the next real node."""
        with suppress(OSError):
            self.plane.request(f"/api/v1/nodes/{self.name}", method="DELETE")
            self.plane.request("/api/v1/namespaces/kube-system/services/kube-dns", method="DELETE")
            self.plane.request(
                "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices/kube-dns-real-node",
                method="DELETE",
            )

    def leftovers(self) -> list[str]:
        """What the node left on the machine: mounts, links, network namespaces, cgroups,
        iptables chains, paths outside its work directory. Empty after a clean `stop`."""
        left = [f"mount {point}" for point in _mounts_under(self.work)]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        left += [f"link {n}" for n in (NODE_BRIDGE, POD_BRIDGE) if f": {n}:" in links]
        left += [
            f"veth {line.split(':')[1].strip()}"
            for line in links.splitlines()
            if f"master {POD_BRIDGE}" in line
        ]
        netns = Path("/run/netns")
        if netns.is_dir():
            left += [f"netns {p.name}" for p in netns.iterdir() if p.name.startswith("cni-")]
        left += [f"cgroup {p}" for p in _cgroups()]
        left += [f"chain {c}" for c in sorted(_chains() - self._before.get("chains", set()))]
        left += [
            f"path {p}"
            for p in OUTSIDE
            if os.path.lexists(p) and p not in self._before.get("outside", OUTSIDE)
        ]
        left += [f"process {c.name}" for c in self.components]
        return left


# Helpers.


def _bin(name: str) -> Path:
    return control_plane.BIN / name


def _run(*arguments: str) -> None:
    answer = subprocess.run(arguments, capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        raise RealNodeError(f"{' '.join(arguments)}: {answer.stderr.strip()}")


def _toml(value: object) -> str:
    return json.dumps(str(value))


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def _http_ok(url: str, *, any_status: bool = False) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError:
        return any_status
    except OSError:
        return False


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text()
    except OSError:
        return None


def _mounts_under(directory: Path) -> list[str]:
    """Mount points at or below `directory`, from this process's mount table."""
    prefix = str(directory.resolve()) if directory.exists() else str(directory)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points


def _unmount(point: str) -> None:
    answer = subprocess.run(["umount", point], capture_output=True, check=False)
    if answer.returncode != 0:
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


_TABLES = ("filter", "nat", "mangle")


def _chains() -> set[str]:
    """`table/chain` for every iptables chain (IPv4) on the machine."""
    found: set[str] = set()
    if shutil.which("iptables-save", path="/usr/sbin:/sbin") is None:
        return found
    for table in _TABLES:
        answer = subprocess.run(
            ["iptables-save", "-t", table],
            capture_output=True,
            text=True,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        found |= {f"{table}/{m}" for m in re.findall(r"^:(\S+)", answer.stdout, re.MULTILINE)}
    return found


def _drop_chains(chains: set[str]) -> None:
    """Flush, unlink and delete chains someone left (kube-proxy cleans its own)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    for entry in sorted(chains):
        table, chain = entry.split("/", 1)
        subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True, env=env)
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, env=env).stdout
    table = ""
    for line in rules.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A ") and any(
            f"-j {e.split('/', 1)[1]}" in line for e in chains if e.startswith(f"{table}/")
        ):
            subprocess.run(
                ["iptables", "-t", table, "-D", *line.split()[1:]], capture_output=True, env=env
            )
    for entry in sorted(chains):
        table, chain = entry.split("/", 1)
        subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True, env=env)


def _cgroups() -> list[Path]:
    """The kubelet's `kubepods` cgroups in every v1 hierarchy."""
    return sorted(Path("/sys/fs/cgroup").glob("*/kubepods"))


def _remove_cgroups() -> None:
    for top in _cgroups():
        for directory in sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with suppress(OSError):
                directory.rmdir()
        with suppress(OSError):
            top.rmdir()
