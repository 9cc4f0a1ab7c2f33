"""Module parameters end to end: a real nats-server, the simulated cluster, discovery and the
driver-manager as `gpuop run` processes on each node's host root, and the upgrade
orchestrator, as in `test_drift_rollout`.

The policy asks for a new driver with parameters: the upgrade loads the modules with them.
A change of the parameters alone (the same version) reloads every node's modules with the
new ones, one node at a time, through the upgrade saga. A change to a value the module's type
refuses (past `gpuop upgrade start`'s check: an edit of the policy) fails each node's load,
and the rollback loads the modules with the parameters they ran with before. A replay of the
log decides the same."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio import client as k8s

from gpuop.bus import NatsBus, NatsServer
from gpuop.cli.events import export_lines
from gpuop.events import decode, subjects
from gpuop.events.upgrade import SagaStarted, UpgradeState
from gpuop.host import modules, packaging, parameters, system
from gpuop.host.roots import HostRoot
from gpuop.kube import client, customobjects, nodes
from gpuop.policy import crd, specs
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop.services.upgrade_orchestrator import leading
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop_sim import SimCluster
from gpuop_sim.cluster import hosts
from gpuop_sim.host import keys, seeding
from tests.support.processes import DISCOVERY_CONFIG, DRIVER_MANAGER_CONFIG, service
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
GPUS = 2
OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
TIMEOUT = 60.0
CONFIG = OrchestratorConfig(lease_duration_seconds=3, resync_seconds=0.5)
FIRST = {"nvidia": {"NVreg_EnableGpuFirmware": 1}}
SECOND = {"nvidia": {"NVreg_EnableGpuFirmware": 0}, "nvidia_uvm": {"uvm_disable_hmm": "Y"}}
REFUSED = {"nvidia": {"NVreg_EnableGpuFirmware": "off"}}


def policy(source: Path) -> dict[str, Any]:
    gpu = {"version": NEW, "source": str(source), "publicKeys": [keys.PUBLIC_KEY]}
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {**gpu, "kernelModuleParameters": FIRST}},
            "upgradePolicy": {
                "maxParallelUpgrades": 1,
                "maxUnavailable": 1,
                "drain": {"enable": True, "force": True, "deleteEmptyDir": True},
                "retry": {"maxAttempts": 1},
            },
        },
    }


def shown(root: HostRoot) -> dict[str, dict[str, str]]:
    found = {m: parameters.shown(root, m) for m in ("nvidia", "nvidia_uvm")}
    return {m: p for m, p in found.items() if p}


def words(wanted: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {m: {k: str(v) for k, v in p.items()} for m, p in wanted.items()}


@contextlib.asynccontextmanager
async def orchestrator(bus: NatsBus, kube: client.Kube) -> AsyncIterator[None]:
    stopping = asyncio.Event()
    task = asyncio.create_task(leading.lead(bus, kube, CONFIG, stopping, identity="replica"))
    try:
        yield
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)


async def test_a_change_of_the_parameters_reloads_the_modules_and_a_refused_one_rolls_back(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    exit_codes: dict[str, int | None] = {}
    logs: list[Path] = []

    async def wait_until(what: str, check: Any) -> None:
        try:
            await eventually(check, TIMEOUT, interval=0.2)
        except TimeoutError:
            tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
            raise AssertionError(f"{what} did not happen\n{tails}") from None

    async with SimCluster(nodes=2, gpus=GPUS, workloads=False, seed=5) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        (tmp_path / "discovery.yaml").write_text(DISCOVERY_CONFIG)
        (tmp_path / "driver-manager.yaml").write_text(DRIVER_MANAGER_CONFIG)
        nats = ["--nats", nats_server.url]
        source = tmp_path / "driver-source"
        roots: dict[str, HostRoot] = {}
        bus = NatsBus(nats_server.url, name="orchestrator")
        await bus.start()
        async with AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            for node in cluster.node_names:
                machine = cluster.machine(node)
                root = hosts.build_host_root(
                    tmp_path / f"host-{node}", node, GPUS, gpu_version=OLD,
                    boot_id=machine.boot_id, product_name=machine.type.name,
                )  # fmt: skip
                roots[node] = root
                if not source.exists():
                    kernel = system.kernel_release(root)
                    assert kernel is not None
                    packaging.build_driver_source(
                        source, [("gpu", OLD, kernel), ("gpu", NEW, kernel)],
                        signing_key=keys.SIGNING_KEY,
                    )  # fmt: skip
                on_node = ["--node", node, *nats, "--host-root", str(root.path)]
                on_node += ["--nvml", f"sim:{GPUS}"]
                for name, arguments in (
                    ("discovery", ["--role", "node", "--config", f"{tmp_path}/discovery.yaml"]),
                    ("driver-manager", ["--config", f"{tmp_path}/driver-manager.yaml"]),
                ):
                    log = tmp_path / f"{name}-{node}.log"
                    logs.append(log)
                    await stack.enter_async_context(
                        service(f"{name}-{node}", [name, *on_node, *arguments], log, exit_codes)
                    )
            log = tmp_path / "discovery-cluster.log"
            logs.append(log)
            await stack.enter_async_context(
                service(
                    "discovery-cluster",
                    ["discovery", "--role", "cluster", *nats, "--kubeconfig", str(kubeconfig)],
                    log,
                    exit_codes,
                )
            )
            kube = await stack.enter_async_context(await client.connect(kubeconfig))

            async def states() -> dict[str, str | None]:
                found = {n: nodes.labels_of(await nodes.get(kube, n)) for n in cluster.node_names}
                return {n: labels.get(STATE_LABEL) for n, labels in found.items()}

            async def discovered() -> bool:
                found = {n: nodes.labels_of(await nodes.get(kube, n)) for n in cluster.node_names}
                return all("nvidia.com/gpu.present" in found[n] for n in cluster.node_names)

            def running(wanted: dict[str, dict[str, Any]]) -> Any:
                async def check() -> bool:
                    done = all(
                        s == UpgradeState.UPGRADE_DONE.value for s in (await states()).values()
                    )
                    return done and all(shown(r) == words(wanted) for r in roots.values())

                return check

            async def set_parameters(wanted: dict[str, dict[str, Any]]) -> None:
                patch = {"spec": {"driver": {"gpu": {"kernelModuleParameters": wanted}}}}
                await customobjects.patch(
                    kube, customobjects.GPU_CLUSTER_POLICIES, "default", patch
                )

            await wait_until("discovery labelling every node", discovered)
            definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
            await k8s.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(
                definition
            )
            await customobjects.create(kube, customobjects.GPU_CLUSTER_POLICIES, policy(source))

            async with orchestrator(bus, kube):
                await wait_until("the upgrade loading the first parameters", running(FIRST))
                assert all(modules.module_version(r, "nvidia") == NEW for r in roots.values())

                await set_parameters({"nvidia": None, **SECOND})  # merge patch: replace
                await wait_until("the reload with the second parameters", running(SECOND))

                await set_parameters({"nvidia_uvm": None, **REFUSED})

                async def failed_and_rolled_back() -> bool:
                    failed = all(
                        s == UpgradeState.UPGRADE_FAILED.value for s in (await states()).values()
                    )
                    return failed and all(shown(r) == words(SECOND) for r in roots.values())

                await wait_until("each node rolled back to the second", failed_and_rolled_back)

        started: dict[str, list[SagaStarted]] = defaultdict(list)
        reader = NatsBus(nats_server.url, name="reader")
        await reader.start()
        try:
            exported = await export_lines(reader)
            async for message in reader.read(subjects.events_filter("upgrade", name="*")):
                envelope, payload = decode(message.data)
                if isinstance(payload, SagaStarted):
                    started[envelope.node].append(payload)
        finally:
            await reader.close()

    log = replaying.parse_log(exported)
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
    for node in cluster.node_names:
        assert [s.running_parameters for s in started[node]] == [
            None,  # no saga of ours loaded its modules yet: unknown
            words(FIRST),
            words(SECOND),
        ]
    assert all(code == 0 for code in exit_codes.values()), sorted(exit_codes.items())
