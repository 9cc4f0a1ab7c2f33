"""A rollout that touches real pods, for the real-node suites: the real node
(`tests.support.real_node`) among KWOK nodes on one control plane, gpuop's node agents
running for real on the real node, and the upgrade orchestrator acting through the admin's
kubeconfig.

`orchestrating` runs, for the length of a block: the real node's discovery, driver-manager,
device plugin and telemetry as `gpuop run` processes on its host root (NVML `sim:<gpus>`,
the CDI spec written first as the driver-manager writes it after a load), the orchestrator
as a `gpuop run` process too (every operand of the real node to pause before an unload or
a reset), and fake agents in the test's process that answer every command for the KWOK
nodes at once (`tests.support.orchestrator.answers`, their inventories put in KV as
discovery would). `apply_policy` makes the GPUClusterPolicy (the CRD
installed first), replacing one a test made before. `PodWatch` keeps every version of every
pod the apiserver showed (`kubectl get pods --watch`), so a test reads the status the kubelet
reported just before a pod was gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuop.bus import Buckets, ConsumerSpec, Delivery, NatsBus, NatsServer
from gpuop.events import new_event, subjects
from gpuop.host import cdi, packages, packaging, system
from gpuop.host.roots import HostRoot
from gpuop.policy import crd, specs
from gpuop_sim.host import keys
from tests.support import cdi as support_cdi
from tests.support import dra_nodes
from tests.support.control_plane import ControlPlane, binary
from tests.support.orchestrator import answers
from tests.support.processes import DISCOVERY_CONFIG, DRIVER_MANAGER_CONFIG, GPUOP, service
from tests.support.real_node import RealNode
from tests.support.sagas import inventory
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
AGENT_SOURCE = "/gpuop/fake-node-agent"
ORCHESTRATOR = "operands: [discovery, device-plugin, telemetry]\nresync_seconds: 0.5\n"
"""Every operand on the real node holds the simulated NVML, so each must pause before an
unload (the KWOK nodes' fake agents confirm all three at once)."""
GPU = "nvidia.com/gpu"
POLICIES = f"/apis/{specs.GROUP}/{specs.VERSION}/{specs.PLURAL}"
TELEMETRY_CONFIG = "interval_seconds: 1\n"
KWOK_BOOT_ID = "bbbbbbbb-0000-4000-8000-000000000000"
"""The KWOK nodes' boot id in their inventories (they never reboot)."""


def driver_version(node: RealNode) -> str:
    """The GPU driver the real node's (simulated) kernel has loaded."""
    return (node.host_root / "sys/module/nvidia/version").read_text(encoding="utf-8").strip()


def preinstall(node: RealNode, version: str) -> None:
    """GPU driver `version` installed on the real node beside the one in use, as a format 2
    package's install leaves it (module stand-ins for the simulated kernel, the user space
    under `opt/gpuop/gpu/<version>`, not in use): a load of it then switches the user space
    and writes the CDI spec for it. The driver source's archives are format 1 stand-ins, whose
    loads leave no user space and no spec, so a pod would see no driver library."""
    root = HostRoot(node.host_root)
    release = system.kernel_release(root) or ""
    if packages.package_dir(root, release, "gpu", version).is_dir():
        return
    packages.install_standins(root, "gpu", version, release)
    support_cdi.install_userspace(root, support_cdi.manifest(version, release), current=False)


def driver_source(node: RealNode, path: Path, versions: tuple[str, ...]) -> Path:
    """A signed driver source with a GPU package of each of `versions` for the real node's
    kernel (made once; a later call reuses it)."""
    if not (path / packaging.INDEX).exists():
        release = system.kernel_release(HostRoot(node.host_root)) or ""
        packaging.build_driver_source(
            path, [("gpu", version, release) for version in versions],
            signing_key=keys.SIGNING_KEY,
        )  # fmt: skip
    return path


def driver_spec(source: Path, version: str) -> dict[str, Any]:
    """The policy's `driver` section: GPU driver `version` from the signed `source`."""
    return {"gpu": {"version": version, "source": str(source), "publicKeys": [keys.PUBLIC_KEY]}}


def apply_policy(plane: ControlPlane, spec: dict[str, Any]) -> None:
    """The GPUClusterPolicy `default` with `spec`, replacing any; the CRD first, as Helm
    installs it with the chart."""
    definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    plane.request(crds, method="POST", body=definition)
    plane.request(f"{POLICIES}/default", method="DELETE")
    body = {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": spec,
    }
    answer = b""
    for _ in range(300):  # a new CRD serves a moment after its create; a delete takes one too
        status, answer = plane.request(POLICIES, method="POST", body=body)
        if status == 201:
            return
        if status not in (404, 409):
            break
        time.sleep(0.1)
    raise AssertionError(f"the policy was not created: {answer.decode(errors='replace')}")


@dataclass
class Orchestrating:
    """What `orchestrating` runs: a connection of the test's own to the bus, and the real
    node's agents' exit codes (once they stopped)."""

    bus: NatsBus
    exit_codes: dict[str, int | None]


async def _write_spec(node: RealNode, gpus: int) -> None:
    host = ["--host-root", str(node.host_root), "--nvml", f"sim:{gpus}", "--node", node.name]
    spec = cdi.spec_path(HostRoot(node.host_root))
    generate = [*GPUOP, "cdi", "generate", *host, "--out", str(spec)]
    await asyncio.to_thread(subprocess.run, generate, check=True, capture_output=True)


async def _fake_agents(bus: NatsBus, kwok: list[str], version: str, exits: AsyncExitStack) -> None:
    """The KWOK nodes' agents: their inventory (driver `version`) in KV, every command to
    them answered at once as healthy agents answer."""
    inventories = await bus.kv(Buckets.NODES)
    for node in kwok:
        found = inventory(KWOK_BOOT_ID, gpu=version, ofed=None)
        await inventories.put(subjects.encode_node(node), found.model_dump_json().encode())

    async def answer(delivery: Delivery) -> None:
        for event in answers(delivery.payload, delivery.envelope.id):
            await bus.publish(
                new_event(event, node=delivery.envelope.node, source=AGENT_SOURCE,
                          causationid=delivery.envelope.id)
            )  # fmt: skip

    filters = tuple(subjects.commands_filter(node=node) for node in kwok)
    consumer = await bus.consume(ConsumerSpec(durable="kwok-agents", subjects=filters), answer)
    exits.push_async_callback(consumer.stop)


@asynccontextmanager
async def orchestrating(
    plane: ControlPlane,
    node: RealNode,
    kwok: list[str],
    nats: NatsServer,
    *,
    gpus: int,
    kwok_version: str,
    dra: bool = False,
) -> AsyncIterator[Orchestrating]:
    """The real node's agents, the KWOK nodes' fake ones (running `kwok_version`) and the
    orchestrator, until the block ends; every agent then stops with SIGTERM. With `dra`,
    the real node serves its GPUs through DRA (`tests.support.dra_nodes`) and the device
    plugin's cluster role runs too."""
    work = node.work / "agents"
    work.mkdir(exist_ok=True)
    configs = {
        "discovery": DISCOVERY_CONFIG,
        "driver-manager": DRIVER_MANAGER_CONFIG,
        "telemetry": TELEMETRY_CONFIG,
    }
    for name, text in configs.items():
        (work / f"{name}.yaml").write_text(text, encoding="utf-8")
    await _write_spec(node, gpus)
    exit_codes: dict[str, int | None] = {}
    on_node = ["--node", node.name, "--nats", nats.url, "--host-root", str(node.host_root)]
    on_node += ["--nvml", f"sim:{gpus}", "--metrics-listen", "127.0.0.1:0"]
    agents = {
        "discovery": ["--role", "node", "--config", str(work / "discovery.yaml")],
        "driver-manager": ["--config", str(work / "driver-manager.yaml")],
        "device-plugin": ["--role", "node"],
        "telemetry": ["--role", "node", "--config", str(work / "telemetry.yaml")],
    }
    plugin_log = work / "device-plugin.log"
    registrations = dra_nodes.registrations if dra else _registrations
    registered = registrations(plugin_log)
    async with AsyncExitStack() as exits:
        if dra:
            dra_nodes.serving_dra(node)
            exits.enter_context(dra_nodes.kubelet_root_seen(node))
            config = dra_nodes.plugin_config(node, work / "device-plugin.yaml")
            agents["device-plugin"] += ["--config", str(config)]
            agents["device-plugin-cluster"] = [
                "--role", "cluster", "--kubeconfig", str(plane.admin_kubeconfig),
            ]  # fmt: skip
        for name, extra in agents.items():
            log = work / f"{name}.log"
            if name == "device-plugin-cluster":
                arguments = ["device-plugin", *extra, "--nats", nats.url]
                arguments += ["--metrics-listen", "127.0.0.1:0"]
            else:
                arguments = [name, *on_node, *extra]
            await exits.enter_async_context(service(name, arguments, log, exit_codes))
        # a pod admitted before this plugin registers goes to the endpoint of the one a test
        # before stopped, which the kubelet keeps a while: UnexpectedAdmissionError
        await eventually(lambda: registrations(plugin_log) > registered, timeout=120, interval=0.5)
        (work / "orchestrator.yaml").write_text(ORCHESTRATOR, encoding="utf-8")
        orchestrator = ["upgrade-orchestrator", "--role", "cluster", "--nats", nats.url]
        orchestrator += ["--kubeconfig", str(plane.admin_kubeconfig)]
        orchestrator += ["--config", str(work / "orchestrator.yaml")]
        log = work / "orchestrator.log"
        await exits.enter_async_context(service("orchestrator", orchestrator, log, exit_codes))
        buses = {}
        for name in ("observer", "kwok-agents"):  # a connection each, as processes have
            buses[name] = NatsBus(nats.url, name=f"real-node-test-{name}")
            await buses[name].start()
            exits.push_async_callback(buses[name].close)
        await _fake_agents(buses["kwok-agents"], kwok, kwok_version, exits)
        yield Orchestrating(buses["observer"], exit_codes)


def _registrations(plugin_log: Path) -> int:
    """How often the device plugin logged its registration with the kubelet."""
    if not plugin_log.exists():
        return 0
    return plugin_log.read_text(errors="replace").count(f"registered {GPU} with the kubelet")


class PodWatch:
    """`kubectl get pods --all-namespaces --watch` as JSON for the length of a `with` block:
    every version of every pod the apiserver showed, in order."""

    def __init__(self, plane: ControlPlane, output: Path) -> None:
        self.output = output
        command = [str(binary("kubectl")), "--kubeconfig", str(plane.admin_kubeconfig)]
        command += ["get", "pods", "--all-namespaces", "--watch", "--output-watch-events"]
        self._command = [*command, "-o", "json"]
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PodWatch:
        with self.output.open("wb") as out:
            self._process = subprocess.Popen(self._command, stdout=out, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *_: object) -> None:
        if self._process is not None:
            self._process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(10)
            if self._process.returncode is None:
                self._process.kill()
                self._process.wait()

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(ADDED|MODIFIED|DELETED, pod) as they came so far."""
        text = self.output.read_text(encoding="utf-8", errors="replace")
        decoder = json.JSONDecoder()
        at = 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                return
            try:
                event, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError:  # the last one still being written
                return
            yield event["type"], event["object"]

    def versions(self, namespace: str, name: str) -> list[tuple[str, dict[str, Any]]]:
        """Every (event type, pod) of one pod."""
        return [
            (kind, pod)
            for kind, pod in self.events()
            if pod["metadata"]["namespace"] == namespace and pod["metadata"]["name"] == name
        ]


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The first container's `state.terminated`, if it has one."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        found = (status.get("state") or {}).get("terminated")
        if found:
            return dict(found)
    return None


def events_of(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    """`kubectl get events` of one object, one line each: reason, source, message."""
    selector = f"involvedObject.name={name}"
    answer = plane.call("GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}")
    lines = []
    for event in sorted(answer["items"], key=lambda e: e.get("firstTimestamp") or ""):
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
        lines.append(f"{event['type']} {event['reason']} ({source}): {event['message']}")
    return lines
