"""The whole upgrade stack on one machine, for the rollout end-to-end tests: a real
nats-server (the test's `nats_server` fixture), the simulated cluster with GPU workloads under
PodDisruptionBudgets, on every node discovery and the driver-manager as `gpuop run`
processes on the node's own host root (with `operands`, the device plugin and telemetry too,
beside a simulated kubelet's gRPC side, and the orchestrator pauses them for each reload),
discovery's cluster role, a driver source, and upgrade-orchestrator replicas as processes the
test may SIGKILL and start again; node agents can be SIGKILLed and started again too.

`Stack.start_rollout` installs the CRD and the GPUClusterPolicy; the outcome is read from
the event log (`Stack.export`) and the Nodes, never from the orchestrator's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.aio import client as k8s

from gpuop.bus import NatsBus, grants
from gpuop.cli.events import export_lines
from gpuop.host import packaging, system
from gpuop.host.roots import HostRoot
from gpuop.kube import client, customobjects, nodes, pods
from gpuop.kube import errors as kube_errors
from gpuop.policy import crd, specs
from gpuop.saga.actions import STATE_LABEL
from gpuop_sim import SimCluster
from gpuop_sim.apiserver.faults import FaultPlan
from gpuop_sim.cluster import hosts
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from gpuop_sim.cluster.kwok import KwokFleet
from gpuop_sim.host import keys, seeding
from tests.support import fleet
from tests.support.callout_nats import CalloutNats
from tests.support.control_plane import ControlPlane
from tests.support.processes import start_service
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
OFED_OLD, OFED_NEW = "24.10-1.1.4.0", "25.01-0.6.0.0"
DISCOVERY_CONFIG = (
    "scan_interval_seconds: 2\nheartbeat_interval_seconds: 2\nretry_interval_seconds: 0.2\n"
)
DRIVER_MANAGER_CONFIG = f"kernel: auto\nunload_poll_seconds: 0.1\ntrust: {json.dumps(keys.TRUST)}\n"
ORCHESTRATOR_CONFIG = "lease_duration_seconds: 3\nresync_seconds: 0.5\n"
OPERANDS = ("device-plugin", "telemetry")
TELEMETRY_CONFIG = "interval_seconds: 1\n"
DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
STARTED = "health endpoints on"
"""What `gpuop run` logs once its signal handlers are installed."""
STARTUP = 180.0
"""Seconds for every process to start and discovery to label every node: dozens of Python
processes importing at once on two cores, on a machine that may be busy with more."""
STOP_GRACE = 90.0
"""Seconds every process together has to exit after SIGTERM: dozens of them stopping at
once on two cores take a while; a service that hangs dumps its stacks into its log and
exits 1 after `gpuop.runtime.launching.STOP_GRACE` (60 s), before this SIGKILL."""


@dataclass
class Stack:
    """A running stack; build it with `stack(...)`."""

    cluster: SimCluster | KwokFleet
    kube: client.Kube
    bus: NatsBus
    nats_url: str
    kubeconfig: Path
    work: Path
    source: Path
    roots: dict[str, HostRoot]
    logs: list[Path] = field(default_factory=list)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    replicas: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    """Running orchestrator replicas by name."""
    agents: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    """Node agents and discovery's cluster role by name."""
    agent_arguments: dict[str, list[str]] = field(default_factory=dict)
    """How each agent was started, to start it again."""
    nats_replicas: int = 1
    """Replicas of the streams and buckets every service is told to keep."""
    kubelets: dict[str, KubeletGrpc] = field(default_factory=dict)
    """With `operands`: each node's simulated kubelet gRPC side, by node name (a test
    allocates a GPU to a pod through it, for PodResources to name the pod)."""
    role_kubeconfigs: dict[str, Path] = field(default_factory=dict)
    """The cluster roles' own kubeconfigs by role ("upgrade-orchestrator",
    "discovery-cluster"): on a real cluster their chart ServiceAccount's token, so a missing
    permission fails the test; the admin's (`kubeconfig`) where a role has none."""
    callout: CalloutNats | None = None
    """In callout mode (the shipped default): the server and its callout; each service then
    connects with a token of its own ServiceAccount on its node (`nats_flags`)."""
    _started: int = 0

    @property
    def nats_arguments(self) -> list[str]:
        """The NATS flags of every service: the server list and the replica count."""
        return ["--nats", self.nats_url, "--nats-replicas", str(self.nats_replicas)]

    def nats_flags(self, identity: grants.Identity) -> list[str]:
        """The NATS flags of the service that is `identity`: `nats_arguments`, and in
        callout mode a file with a token of its own, which the callout admits as that
        identity's user."""
        if self.callout is None:
            return self.nats_arguments
        token = self.work / "tokens" / f"{identity.role}-{identity.node or 'cluster'}"
        token.parent.mkdir(exist_ok=True)
        token.write_text(self.callout.token(identity.role, identity.node), encoding="utf-8")
        return [*self.nats_arguments, "--nats-token-file", str(token)]

    @property
    def node_names(self) -> list[str]:
        return list(self.cluster.node_names)

    def tail_of(self, name: str, keep: int) -> str:
        text = (self.work / f"{name}.log").read_text(errors="replace")
        return f"--- {name}.log\n{text[-keep:]}"

    async def report(self) -> str:
        """What a failed wait shows: each node's upgrade state, the log tails of the nodes
        not done, and of the running orchestrator replicas after they logged where each of
        their tasks waits (SIGUSR1, `gpuop.runtime.launching.dump_tasks`)."""
        for process in self.replicas.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1.0)
        try:
            states = {node: found.get(STATE_LABEL) for node, found in (await self.labels()).items()}
        except Exception as error:  # the report must not hide the failure it reports
            states = {"(labels unreadable)": repr(error)}
        parts = ["states: " + ", ".join(f"{node}={state}" for node, state in states.items())]
        for node, state in states.items():
            if state != "upgrade-done":
                parts.append(await self._pods_report(node))
                if f"driver-manager-{node}" in self.agents:
                    parts.append(self.tail_of(f"driver-manager-{node}", 1200))
        parts.append(await self._policy_status())
        # the leader's log first and longest: the others follow and wait
        leader = self.leader()
        parts += [
            self.tail_of(name, 12000 if name == leader else 1500)
            for name in sorted(self.replicas, key=lambda name: name != leader)
        ]
        parts.append(f"(every log is under {self.work})")
        return "\n".join(parts)

    async def _policy_status(self) -> str:
        """The GPUClusterPolicy's status as the orchestrator wrote it (skipped nodes and why,
        the rollout's counts, the conditions), one line."""
        try:
            policy = await customobjects.get(
                self.kube, customobjects.GPU_CLUSTER_POLICIES, "default"
            )
        except Exception as error:  # the report must not hide the failure it reports
            return f"--- policy status: unreadable ({error!r})"
        return f"--- policy status: {json.dumps(policy.get('status') or {}, sort_keys=True)}"[:4000]

    async def _pods_report(self, node: str) -> str:
        """The pods bound to `node`: name, phase, whether deleted, each container's state."""
        try:
            found = await pods.on_node(self.kube, node)
        except Exception as error:  # the report must not hide the failure it reports
            return f"--- pods on {node}: unreadable ({error!r})"
        lines = [f"--- pods on {node}"]
        for pod in found:
            meta, status = pod["metadata"], pod.get("status") or {}
            deleted = " deleted" if meta.get("deletionTimestamp") else ""
            states = [
                f"{c.get('name')}={next(iter(c.get('state') or {'-': 0}))}"
                for c in status.get("containerStatuses") or []
            ]
            lines.append(
                f"{meta['namespace']}/{meta['name']} {status.get('phase')}{deleted} "
                f"{' '.join(states)} {status.get('reason') or ''}".rstrip()
            )
        return "\n".join(lines)

    async def wait_until(
        self, what: str, check: Callable[[], Awaitable[bool]], timeout: float
    ) -> None:
        """Poll `check` until it is true; on timeout fail with `report`."""
        try:
            await eventually(check, timeout, interval=0.25)
        except TimeoutError:
            raise AssertionError(f"{what} did not happen\n{await self.report()}") from None

    async def labels(self) -> dict[str, dict[str, str]]:
        return {n: nodes.labels_of(await nodes.get(self.kube, n)) for n in self.node_names}

    async def start_replica(self) -> str:
        """Start one more orchestrator replica process; its name."""
        self._started += 1
        name = f"orchestrator-{self._started}"
        log = self.work / f"{name}.log"
        self.logs.append(log)
        orchestrator = grants.Identity("upgrade-orchestrator", None)
        arguments = ["upgrade-orchestrator", "--role", "cluster", *self.nats_flags(orchestrator)]
        kubeconfig = self.role_kubeconfigs.get("upgrade-orchestrator", self.kubeconfig)
        arguments += ["--kubeconfig", str(kubeconfig), "--config", str(self._orchestrator)]
        self.replicas[name] = await start_service(arguments, log)
        return name

    def unclean_exits(self) -> dict[str, int | None]:
        """Processes that did not exit 0 when stopped (None: killed after not stopping), with
        the tail of their logs on stderr."""
        unclean = {name: code for name, code in self.exit_codes.items() if code != 0}
        for name in unclean:
            log = self.work / f"{name}.log"
            print(f"--- {name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        return unclean

    def leader(self) -> str | None:
        """The running replica that says it leads now (its log: the last word on the lease
        is "leading as"), if any."""
        for name in self.replicas:
            lines = (self.work / f"{name}.log").read_text(errors="replace").splitlines()
            said = [line for line in lines if "leading as" in line or "lost the lease" in line]
            if said and "leading as" in said[-1]:
                return name
        return None

    def kill_replica(self, name: str) -> None:
        """SIGKILL replica `name`: no goodbye, its lease stays until it expires."""
        process = self.replicas.pop(name)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)

    async def kill_agent(self, name: str) -> None:
        """SIGKILL node agent `name` (e.g. "driver-manager-gpu-node-3") and reap it."""
        process = self.agents[name]
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        await process.wait()

    async def restart_agent(self, name: str) -> None:
        """Start agent `name` again, as it was started, its log appended to."""
        process = self.agents[name]
        if process.returncode is None:
            raise RuntimeError(f"{name} still runs")
        log = self.work / f"{name}.log"
        started = log.read_text(errors="replace").count(STARTED)
        self.agents[name] = await start_service(self.agent_arguments[name], log)

        async def up() -> bool:  # its signal handlers are in place: a SIGTERM stops it cleanly
            return log.read_text(errors="replace").count(STARTED) > started

        await self.wait_until(f"{name} started again", up, STARTUP)

    async def start_rollout(
        self,
        upgrade_policy: dict[str, Any],
        *,
        ofed: str | None = None,
        version: str = NEW,
        remediation: dict[str, Any] | None = None,
        mig: dict[str, Any] | None = None,
    ) -> None:
        """Install the CRD and create the policy asking for driver `version` (`NEW`; `OLD`:
        no rollout) and OFED `ofed`, with `remediation` and `mig` as those sections."""
        definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
        extensions = k8s.ApiextensionsV1Api(self.kube.api_client)
        # On a real cluster Helm installed it with the chart.
        with contextlib.suppress(kube_errors.AlreadyExists):
            await self.kube.call(extensions.create_custom_resource_definition, definition)
        await self._established(extensions, definition["metadata"]["name"])
        signed = {"source": str(self.source), "publicKeys": [keys.PUBLIC_KEY]}
        driver: dict[str, Any] = {"gpu": {"version": version, **signed}}
        if ofed is not None:
            driver["ofed"] = {"version": ofed, **signed}
        spec: dict[str, Any] = {"driver": driver, "upgradePolicy": upgrade_policy}
        if remediation is not None:
            spec["remediation"] = remediation
        if mig is not None:
            spec["mig"] = mig
        policy = {
            "apiVersion": specs.API_VERSION,
            "kind": specs.KIND,
            "metadata": {"name": "default"},
            "spec": spec,
        }
        await self.kube.call(
            self.kube.custom_objects.create_cluster_custom_object,
            specs.GROUP, specs.VERSION, specs.PLURAL, policy,
        )  # fmt: skip

    async def _established(self, extensions: Any, name: str) -> None:
        """Until the CRD serves: the real apiserver establishes one a moment after create."""

        async def established() -> bool:
            found = await self.kube.call(extensions.read_custom_resource_definition, name)
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        await self.wait_until(f"CRD {name} established", established, 30)

    async def export(self) -> list[str]:
        """The event and command log, as `gpuop events export` writes it."""
        return await export_lines(self.bus)

    @property
    def _orchestrator(self) -> Path:
        return self.work / "orchestrator.yaml"


def set_package(
    source: Path, version: str, kernel_release: str, *, defective: bool = False
) -> packaging.BuiltPackage:
    """(Re)build the GPU package of `version` for `kernel_release` in driver source
    `source` and point its index entry at the new archive."""
    built = packaging.build_package(source, "gpu", version, kernel_release, defective=defective)
    index_path = source / packaging.INDEX
    index = json.loads(index_path.read_text(encoding="utf-8"))
    entries = [e for e in index["packages"] if e["file"] != built.path.name]
    index["packages"] = [*entries, built.index_entry()]
    index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    packaging.sign_driver_source(source, keys.SIGNING_KEY)
    return built


@contextlib.asynccontextmanager
async def stack(
    work: Path,
    nats_url: str,
    *,
    nodes_count: int,
    gpus: int,
    kernels: dict[int, str] | None = None,
    ofed: bool = False,
    prepare: Callable[[int, HostRoot], None] | None = None,
    seed: int = 0,
    operands: bool = False,
    driver_manager: dict[int, str] | None = None,
    faults: FaultPlan | None = None,
    labeler_retry: float | None = None,
    nats_replicas: int = 1,
    plane: ControlPlane | None = None,
    callout: CalloutNats | None = None,
) -> AsyncIterator[Stack]:
    """The stack with no orchestrator yet, once discovery has labelled every node;
    `kernels`: node index -> kernel release for nodes that run another kernel than the
    recording's (the driver source gets OLD and NEW packages for every kernel in use);
    `ofed`: every node runs OFED_OLD too (and the source has OFED_NEW); `prepare` changes
    each node's host root (by index) before its agents start; `operands`: see the module
    docstring; `driver_manager`: node index -> more YAML for that node's driver-manager
    config (fault injection); `faults`: what the API server gets wrong on purpose
    (`cluster.faults` changes it while the stack runs); `labeler_retry`: seconds between
    discovery's cluster role's retries (its default otherwise, 5 s); `nats_replicas`: replicas
    of the streams and buckets (3 on a cluster: `nats_url` is then the server list);
    `plane`: a running real control plane to use instead of the simulated cluster: KWOK GPU
    nodes, the same workloads placed by the real scheduler, the chart installed by the real
    Helm, and the cluster roles acting as their chart ServiceAccounts (`faults` needs the
    simulated cluster); `callout`: the server of `nats_url` runs the shipped callout
    configuration, and each service connects as its own per-node user (`Stack.nats_flags`),
    the stack's observer as `admin`."""
    kernels = kernels or {}
    (work / "discovery.yaml").write_text(DISCOVERY_CONFIG)
    (work / "driver-manager.yaml").write_text(DRIVER_MANAGER_CONFIG)
    (work / "telemetry.yaml").write_text(TELEMETRY_CONFIG)
    paused = f"operands: [{', '.join(OPERANDS)}]\n" if operands else ""
    lease = f"lease_namespace: {fleet.RELEASE_NAMESPACE}\n" if plane is not None else ""
    (work / "orchestrator.yaml").write_text(ORCHESTRATOR_CONFIG + paused + lease)
    if plane is not None and faults is not None:
        raise ValueError("faults are the simulated API server's: not with a real plane")
    async with AsyncExitStack() as exits:
        role_kubeconfigs: dict[str, Path] = {}
        cluster: SimCluster | KwokFleet
        if plane is None:
            cluster = await exits.enter_async_context(
                SimCluster(nodes=nodes_count, gpus=gpus, workloads=True, seed=seed, faults=faults)
            )
            kubeconfig = cluster.write_kubeconfig(work / "kubeconfig")
        else:
            kubeconfig = plane.write_kubeconfig(work / "kubeconfig")
            admin = await exits.enter_async_context(await client.connect(kubeconfig))
            cluster = KwokFleet(admin, nodes_count, gpus, prefix="gpu-node-", seed=seed)
            await cluster.create()  # the nodes go with the plane
            role_kubeconfigs = await asyncio.to_thread(_chart_roles, plane, work)
        observer_url = nats_url if callout is None else callout.admin_url
        bus = NatsBus(observer_url, name="e2e-observer", replicas=nats_replicas)
        await bus.start()
        exits.push_async_callback(bus.close)
        kube = await exits.enter_async_context(await client.connect(kubeconfig))
        source = work / "driver-source"
        roots: dict[str, HostRoot] = {}
        kubelets: dict[str, KubeletGrpc] = {}
        for index, node in enumerate(cluster.node_names):
            machine = cluster.machine(node)
            roots[node] = hosts.build_host_root(
                work / "hosts" / node, node, gpus, gpu_version=OLD, boot_id=machine.boot_id,
                product_name=machine.type.name, kernel_release=kernels.get(index),
                ofed_version=OFED_OLD if ofed else None,
            )  # fmt: skip
            if prepare is not None:
                prepare(index, roots[node])
            if operands:
                kubelet = KubeletGrpc.under(roots[node].path)
                kubelets[node] = await exits.enter_async_context(kubelet)
        releases = sorted({system.kernel_release(root) or "" for root in roots.values()})
        wanted = [("gpu", version) for version in (OLD, NEW)]
        wanted += [("ofed", version) for version in (OFED_OLD, OFED_NEW) if ofed]
        packaging.build_driver_source(
            source,
            [(component, v, kernel) for kernel in releases for component, v in wanted],
            signing_key=keys.SIGNING_KEY,
        )
        running = Stack(cluster, kube, bus, nats_url, kubeconfig, work, source, roots)
        running.nats_replicas = nats_replicas
        running.role_kubeconfigs = role_kubeconfigs
        running.kubelets = kubelets
        running.callout = callout
        exits.push_async_callback(_stop_all, running)
        agents = []
        for index, (node, root) in enumerate(roots.items()):
            on_node = ["--node", node, "--host-root", str(root.path), "--nvml", f"sim:{gpus}"]
            config = work / "driver-manager.yaml"
            if index in (driver_manager or {}):
                config = work / f"driver-manager-{node}.yaml"
                config.write_text(DRIVER_MANAGER_CONFIG + (driver_manager or {})[index])
            services = [
                ("discovery", ["--role", "node", "--config", str(work / "discovery.yaml")]),
                ("driver-manager", ["--config", str(config)]),
            ]
            if operands:
                services.append(("device-plugin", []))
                services.append(("telemetry", ["--config", str(work / "telemetry.yaml")]))
            for name, extra in services:
                flags = running.nats_flags(grants.Identity(name, node))
                agents.append((f"{name}-{node}", [name, *on_node, *flags, *extra]))
        labeler = running.nats_flags(grants.Identity("discovery-cluster", None))
        cluster_role = ["discovery", "--role", "cluster", *labeler]
        if labeler_retry is not None:
            labeler_config = work / "discovery-cluster.yaml"
            labeler_config.write_text(f"retry_interval_seconds: {labeler_retry}\n")
            cluster_role += ["--config", str(labeler_config)]
        labeler_kubeconfig = role_kubeconfigs.get("discovery-cluster", kubeconfig)
        agents.append(
            ("discovery-cluster", [*cluster_role, "--kubeconfig", str(labeler_kubeconfig)])
        )
        for name, arguments in agents:
            log = work / f"{name}.log"
            running.logs.append(log)
            running.agents[name] = await start_service(arguments, log)
            running.agent_arguments[name] = arguments

        async def labelled() -> bool:
            found = await running.labels()
            return all(labels.get(DRIVER_LABEL) == OLD for labels in found.values())

        await running.wait_until("discovery labelling every node", labelled, STARTUP)
        yield running


def _chart_roles(plane: ControlPlane, work: Path) -> dict[str, Path]:
    """Install the chart (its ServiceAccounts and RBAC, with everything else it makes; KWOK
    plays its pods) and write each cluster role's kubeconfig with its ServiceAccount's
    token."""
    fleet.install_chart(plane)
    return {
        role: fleet.service_account_kubeconfig(plane, role, work / f"{role}.kubeconfig")
        for role in ("upgrade-orchestrator", "discovery-cluster")
    }


async def _stop_all(running: Stack) -> None:
    """SIGTERM every process (replicas first), SIGKILL what is still up after `STOP_GRACE`;
    the exit codes land in `exit_codes` (None: it had to be killed)."""
    processes = {**running.replicas, **running.agents}
    for process in processes.values():
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    for name, process in processes.items():
        try:
            running.exit_codes[name] = await asyncio.wait_for(process.wait(), STOP_GRACE)
        except TimeoutError:
            process.kill()
            await process.wait()
            running.exit_codes[name] = None
