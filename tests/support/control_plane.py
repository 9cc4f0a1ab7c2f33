"""A real Kubernetes control plane as local processes, for the real-cluster suites and for
people (`make cluster`): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
KWOK, built from their Go modules by `make cluster-tools` (tests/cluster/build-tools.sh).

Everything binds to loopback on free ports and lives in one work directory: the PKI made
here (a CA, the apiserver's serving certificate, an admin client certificate in
system:masters, a service-account signing key; the CA's key stays, so a test can issue a
kubelet's credential, `system:node:<name>`), etcd's data, each component's log and the
apiserver's audit log (JSON lines, every request at Metadata level, so a test counts
requests by user and verb). The apiserver runs the Node and RBAC authorizers, its default
admission plugins and NodeRestriction, as every conformant cluster does (it keeps a kubelet
to its own Node and from the labels under node-restriction.kubernetes.io/). Each component
runs in its own process group and is stopped with it: SIGTERM in reverse start order, SIGKILL
after a grace. Nothing is downloaded at run time.

KWOK plays every node's kubelet: `Fleet` creates Nodes that report GPU capacity and KWOK
keeps them Ready (node leases) and runs the pods bound to them (Running and Ready; deleted
once their grace ends). Job pods keep running, as a long training job does.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpuop_sim.apiserver import certificates
from tests.support.processes import free_port

REPO = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("GPUOP_CLUSTER_TOOLS", REPO / ".cache" / "cluster-tools"))
BIN = TOOLS / "bin"
STAGES = TOOLS / "kwok-stages"
"""KWOK's default node and pod stages, taken from its module by build-tools.sh."""
VALIDATION_POD_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpuop-validation-pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.labels["gpuop.io/validation-pod"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 0
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""
"""KWOK's pod-complete stage for gpuop's validation pod alone (its label), at once: other
pods keep running, as KWOK's own stages leave them (build-tools.sh), and the upgrade's pod
rung passes as on a healthy node."""
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
ADMIN = "gpuop-admin"
START_TIMEOUT = 90.0
"""Seconds for the apiserver to answer /readyz: its first start on two busy cores is slow."""
STOP_GRACE = 15.0
SERVICE_CIDR = "10.96.0.0/16"
FAKE = "kwok.x-k8s.io/node=fake"
"""The annotation of the KWOK nodes (`gpuop_sim.cluster.kwok.KwokFleet`'s)."""
POD_CIDR = "10.128.0.0/12"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


class ControlPlaneError(RuntimeError):
    """The control plane could not start; the message says why and where its logs are."""


def binary(name: str) -> Path:
    """The built tool `name`, or an error that says how to build it."""
    path = BIN / name
    if not os.access(path, os.X_OK):
        raise ControlPlaneError(
            f"{path} is missing: build the real control plane's tools with `make "
            "cluster-tools` (needs Go 1.26 and the Go module proxy; see DEVELOPERS.md)"
        )
    return path


def missing_tools() -> list[str]:
    return [name for name in (*BINARIES, "kubectl") if not os.access(BIN / name, os.X_OK)]


# PKI.


@dataclass(frozen=True)
class Pki:
    """The files the components are given: PEM certificates and keys under `directory`,
    from a throwaway CA (`gpuop_sim.apiserver.certificates`, the sim's own)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def authority(self) -> certificates.Authority:
        """The CA, to issue more certificates (a real node's kubelet and kube-proxy)."""
        key = serialization.load_pem_private_key(self.key("ca").read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return certificates.Authority(key, x509.load_pem_x509_certificate(self.ca.read_bytes()))

    @staticmethod
    def create(directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        pki = Pki(directory)
        authority = certificates.Authority.create("gpuop-test-ca")
        pki.ca.write_bytes(authority.pem)
        pki.key("ca").write_bytes(certificates.pem_key(authority.key))
        hosts = ("localhost", "kubernetes.default.svc", "127.0.0.1", "10.96.0.1")
        issued = {
            "apiserver": authority.sign("kube-apiserver", hosts=hosts),
            "admin": authority.sign(ADMIN, client=True, organisation="system:masters"),
        }
        for name, (certificate, key) in issued.items():
            pki.cert(name).write_bytes(certificate)
            pki.key(name).write_bytes(key)
        signer = ec.generate_private_key(ec.SECP256R1())
        pki.key("service-accounts").write_bytes(certificates.pem_key(signer))
        public = signer.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pki.cert("service-accounts").write_bytes(public)  # the public key, for verifying
        return pki


def kubeconfig(server: str, ca: Path, user: str, credentials: dict[str, str]) -> dict[str, Any]:
    """A kubeconfig for `user` with `credentials` (client-certificate-data and
    client-key-data, or token), trusting `ca`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpuop-real",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": _b64(ca.read_bytes()),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "gpuop-real", "user": user}}],
        "current-context": user,
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# Processes.


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, keep: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-keep:]


class Launcher:
    """Components started in their own process groups, their output in `work/<name>.log`:
    `with launcher:` starts them (stopping whatever started when that fails) and stops them
    last first, SIGKILL after `STOP_GRACE` (the apiserver stops cleanly only while etcd still
    answers)."""

    work: Path
    components: list[Component]

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for component in reversed(list(self.components)):
            self._stop_component(component)

    def _spawn(self, name: str, arguments: list[str], env: dict[str, str] | None = None) -> None:
        log = self.work / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                arguments,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.work,
                env=env,
                start_new_session=True,  # its own process group, stopped as one
            )
        self.components.append(Component(name, process, log))

    def _stop_component(self, component: Component, number: int = signal.SIGTERM) -> None:
        """SIGTERM (or `number`) to its group, SIGKILL after `STOP_GRACE`, and to whatever
        it left in its group."""
        _signal(component.process, number)
        try:
            component.process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            _signal(component.process, signal.SIGKILL)
            component.process.wait()
        _signal(component.process, signal.SIGKILL)
        self.components.remove(component)

    def _check_running(self) -> None:
        for component in self.components:
            code = component.process.poll()
            if code is not None:
                raise ControlPlaneError(
                    f"{component.name} exited {code}:\n{component.tail()}\n(logs in {self.work})"
                )

    def report(self) -> str:
        return "\n".join(f"--- {c.name}.log\n{c.tail(1500)}" for c in self.components)


@dataclass
class ControlPlane(Launcher):
    """The control plane in `work`; start it with `with ControlPlane(work) as plane`.

    `kwok`: run KWOK for the nodes (`tests.support.fleet` creates them); `controllers`:
    run kube-controller-manager (PDB status, garbage collection, namespaces, service
    accounts); `scheduler`: run kube-scheduler (with the controllers only).
    """

    work: Path
    kwok: bool = True
    controllers: bool = True
    scheduler: bool = True
    stages: Path | None = None
    """A directory of KWOK stage files to run instead of KWOK's defaults (`STAGES`)."""
    advertise: str | None = None
    """The address the apiserver gives as its own in the `kubernetes` Service (it still
    listens on loopback only): a real node's address, where the node relays it to pods
    (`tests.support.real_node`)."""
    kwok_fake_only: bool = False
    """KWOK manages only the nodes annotated `kwok.x-k8s.io/node: fake` (`KwokFleet`'s), not
    all: a real node registers beside them."""
    components: list[Component] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    token: str = field(default_factory=lambda: os.urandom(16).hex())
    """The admin's bearer token (a static token in system:masters), for raw HTTP clients."""

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def pki(self) -> Pki:
        return Pki(self.work / "pki")

    @property
    def audit_log(self) -> Path:
        return self.work / "audit.log"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.work / "admin.kubeconfig"

    def write_kubeconfig(self, path: Path) -> Path:
        """The admin's kubeconfig (client certificate), written to `path`."""
        shutil.copyfile(self.admin_kubeconfig, path)
        return path

    def write_token_kubeconfig(self, path: Path, user: str, token: str) -> Path:
        """A kubeconfig that authenticates as `user` with bearer `token` (a service account's
        token from the TokenRequest API, say)."""
        config = kubeconfig(self.url, self.pki.ca, user, {"token": token})
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def write_node_kubeconfig(self, path: Path, node: str) -> Path:
        """A kubeconfig with the credential of `node`'s kubelet (a client certificate for
        `system:node:<node>` in `system:nodes`), which the Node authorizer and the
        NodeRestriction admission plugin keep to that Node."""
        user = f"system:node:{node}"
        certificate, key = self.pki.authority().sign(user, client=True, organisation="system:nodes")
        credentials = {"client-certificate-data": _b64(certificate), "client-key-data": _b64(key)}
        config = kubeconfig(self.url, self.pki.ca, user, credentials)
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki.ca))

    def start(self) -> None:
        for name in BINARIES if self.kwok else BINARIES[:-1]:
            binary(name)
        self.work.mkdir(parents=True, exist_ok=True)
        pki = Pki.create(self.work / "pki")
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"):
            self.ports[name] = free_port()
        admin = {
            "client-certificate-data": _b64(pki.cert("admin").read_bytes()),
            "client-key-data": _b64(pki.key("admin").read_bytes()),
        }
        self.admin_kubeconfig.write_text(
            yaml.safe_dump(kubeconfig(self.url, pki.ca, ADMIN, admin)), encoding="utf-8"
        )
        self._start_etcd()
        self._start_apiserver(pki)
        self.wait_ready()
        if self.controllers:
            self._start_controllers(pki)
        if self.kwok:
            self._start_kwok()

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                str(binary("etcd")),
                "--name=node0",
                f"--data-dir={self.work / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=node0={peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self, pki: Pki) -> None:
        policy = self.work / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY), encoding="utf-8")
        tokens = self.work / "tokens.csv"
        tokens.write_text(f'{self.token},{ADMIN}-token,{ADMIN}-token,"system:masters"\n')
        self._spawn(
            "kube-apiserver",
            [
                str(binary("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                *([f"--advertise-address={self.advertise}"] if self.advertise else []),
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={pki.cert('apiserver')}",
                f"--tls-private-key-file={pki.key('apiserver')}",
                f"--client-ca-file={pki.ca}",
                f"--token-auth-file={tokens}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.cert('service-accounts')}",
                f"--service-account-signing-key-file={pki.key('service-accounts')}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--profiling=false",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                # A real node's kubelet (tests.support.real_node) is reached by its InternalIP,
                # never by a name the host's resolver would look up, as the admin.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki.cert('admin')}",
                f"--kubelet-client-key={pki.key('admin')}",
            ],
        )

    def _start_controllers(self, pki: Pki) -> None:
        kubeconfig_file = str(self.admin_kubeconfig)
        self._spawn(
            "kube-controller-manager",
            [
                str(binary("kube-controller-manager")),
                f"--kubeconfig={kubeconfig_file}",
                "--controllers=*",
                f"--service-account-private-key-file={pki.key('service-accounts')}",
                f"--root-ca-file={pki.ca}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--concurrent-gc-syncs=10",
            ],
        )
        if not self.scheduler:
            return
        self._spawn(
            "kube-scheduler",
            [
                str(binary("kube-scheduler")),
                f"--kubeconfig={kubeconfig_file}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
            ],
        )

    def _start_kwok(self) -> None:
        directory = self.stages or STAGES
        stages = sorted(directory.glob("*.yaml"))
        if not stages:
            raise ControlPlaneError(f"no KWOK stages under {directory}: run `make cluster-tools`")
        config = self.work / "kwok.yaml"
        documents = [path.read_text(encoding="utf-8") for path in stages]
        config.write_text("\n---\n".join([*documents, VALIDATION_POD_STAGE]), encoding="utf-8")
        self._spawn(
            "kwok",
            [
                str(binary("kwok")),
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--config={config}",
                *(
                    ["--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={FAKE}"]
                    if self.kwok_fake_only
                    else ["--manage-all-nodes=true"]
                ),
                "--node-lease-duration-seconds=40",
                f"--cidr={POD_CIDR}",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
            ],
        )

    def request(
        self,
        path: str,
        *,
        method: str = "GET",
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, bytes]:
        """One request as the admin (its bearer token); the status and the body."""
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.ssl_context()) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as error:
            return int(error.code), bytes(error.read())

    def call(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        """A request that must succeed; its JSON answer. Anything but 2xx raises."""
        status, answer = self.request(path, method=method, body=body, **options)
        if not 200 <= status < 300:
            raise ControlPlaneError(f"{method} {path}: {status} {answer.decode(errors='replace')}")
        return json.loads(answer) if answer else None

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until the apiserver answers /readyz with 200 (within `START_TIMEOUT` seconds
        unless told); a component that exits fails it."""
        timeout = START_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            self._check_running()
            try:
                status, body = self.request("/readyz", timeout=2.0)
                if status == 200:
                    return
                last = f"{status}: {body.decode(errors='replace')[-500:]}"
            except (OSError, ssl.SSLError) as error:
                last = repr(error)
            time.sleep(0.25)
        raise ControlPlaneError(
            f"kube-apiserver not ready within {timeout:g} s (last: {last})\n{self.report()}"
        )

    def audit_events(self) -> Iterator[dict[str, Any]]:
        """The audit log's events so far (each request once, at ResponseComplete)."""
        if not self.audit_log.exists():
            return
        with self.audit_log.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def _signal(process: subprocess.Popen[bytes], number: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, number)
