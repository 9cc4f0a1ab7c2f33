"""The container runtime configured in the maintenance window, end to end: a real
nats-server, the simulated cluster (2 nodes of 2 GPUs with GPU workloads), discovery and the
driver-manager as `gpuop run` processes on each node's host root, and the orchestrator, with
`upgradePolicy.configureRuntime`.

Both nodes run containerd (a version 2 main config). After the new driver is loaded, node 1's
runtime gets the `nvidia` handler's drop-in and its import line, restarts and answers: the
node ends upgrade-done. Node 2's runtime does not come back from its restart (the simulated
runtime's fault): the driver-manager puts its files back byte for byte, the step fails, the
driver is rolled back, and the node ends upgrade-failed with the reason, running its old
driver. The exported log replays to the same decisions."""

from __future__ import annotations

import asyncio
import contextlib
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
from gpuop.events import driver as dm
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.host import modules, packaging, runtimes
from gpuop.kube import client, customobjects, nodes
from gpuop.policy import crd, specs
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop.services.upgrade_orchestrator import leading
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop_sim import SimCluster
from gpuop_sim.cluster import hosts
from gpuop_sim.host import keys, seeding, simruntime
from tests.support.processes import DRIVER_LABEL, cluster_discovery, node_agents
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
GPUS = 2
OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
KERNEL = "6.18.44-fc-v657-gpu"
CONFIG = OrchestratorConfig(lease_duration_seconds=3, resync_seconds=0.5)
MAIN = """\
version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""
RUNTIME_DEADLINE = 20
"""The step's deadline: the driver-manager waits 9 s for an answer, twice on the failure path."""


def policy(source: Path) -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": NEW, "source": str(source),
                               "publicKeys": [keys.PUBLIC_KEY]}},
            "upgradePolicy": {
                # one node at a time: the workloads' disruption budgets allow no more
                "maxParallelUpgrades": 1,
                "maxUnavailable": 1,
                "configureRuntime": True,
                "deadlines": {"runtimeConfigure": RUNTIME_DEADLINE},
                "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 30},
                "drain": {
                    "enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 30
                },
                "retry": {"maxAttempts": 1},
            },
        },
    }  # fmt: skip


async def wait_until(what: str, check: Any, logs: list[Path], timeout: float) -> None:
    try:
        await eventually(check, timeout, interval=0.2)
    except TimeoutError:
        tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
        raise AssertionError(f"{what} did not happen\n{tails}") from None


@contextlib.asynccontextmanager
async def orchestrator(bus: NatsBus, kube: client.Kube) -> AsyncIterator[None]:
    stopping = asyncio.Event()
    task = asyncio.create_task(leading.lead(bus, kube, CONFIG, stopping, identity="replica"))
    try:
        yield
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)


@pytest.mark.timeout(240)
async def test_a_runtime_that_does_not_come_back_is_restored_and_its_node_rolled_back(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    exit_codes: dict[str, int | None] = {}
    logs: list[Path] = []
    source = tmp_path / "driver-source"
    packaging.build_driver_source(
        source, [("gpu", OLD, KERNEL), ("gpu", NEW, KERNEL)], signing_key=keys.SIGNING_KEY
    )
    async with SimCluster(nodes=2, gpus=GPUS, workloads=True, seed=5) as cluster:
        first, second = cluster.node_names
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        bus = NatsBus(nats_server.url, name="orchestrator")
        await bus.start()
        roots = {}
        async with AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            for node in (first, second):
                machine = cluster.machine(node)
                roots[node] = hosts.build_host_root(
                    tmp_path / f"host-{node}", node, GPUS, gpu_version=OLD,
                    boot_id=machine.boot_id, product_name=machine.type.name,
                )  # fmt: skip
                config = roots[node].join(runtimes.CONTAINERD_CONFIG)
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(MAIN)
            await node_agents(stack, tmp_path, nats_server.url, roots, GPUS, logs, exit_codes)
            fault = roots[second].join(simruntime.FAULT)
            fault.parent.mkdir(parents=True, exist_ok=True)
            fault.write_text("containerd fails to start\n")
            await cluster_discovery(stack, tmp_path, nats_server.url, kubeconfig, logs, exit_codes)
            kube = await stack.enter_async_context(await client.connect(kubeconfig))

            async def label(node: str, key: str) -> str | None:
                return nodes.labels_of(await nodes.get(kube, node)).get(key)

            async def labelled_old() -> bool:
                return all([await label(n, DRIVER_LABEL) == OLD for n in (first, second)])

            await wait_until("discovery labelling every node", labelled_old, logs, 20)
            definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
            await k8s.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(
                definition
            )
            await customobjects.create(kube, customobjects.GPU_CLUSTER_POLICIES, policy(source))
            await stack.enter_async_context(orchestrator(bus, kube))

            async def settled() -> bool:
                return (await label(first, STATE_LABEL), await label(second, STATE_LABEL)) == (
                    UpgradeState.UPGRADE_DONE.value,
                    UpgradeState.UPGRADE_FAILED.value,
                )

            await wait_until("node 1 done and node 2 failed", settled, logs, 120)
            configured = roots[first].join(runtimes.CONTAINERD_CONFIG).read_text()
            assert configured.startswith('version = 2\nimports = ["conf.d/99-nvidia.toml"]\n')
            assert roots[first].join(runtimes.CONTAINERD_DROP_IN).exists()
            assert roots[second].join(runtimes.CONTAINERD_CONFIG).read_text() == MAIN
            assert not roots[second].join(runtimes.CONTAINERD_DROP_IN).exists()
            assert modules.module_version(roots[first], "nvidia") == NEW
            assert modules.module_version(roots[second], "nvidia") == OLD

        reader = NatsBus(nats_server.url, name="reader")
        await reader.start()
        try:
            exported = await export_lines(reader)
            changes: dict[str, list[NodeUpgradeStateChanged]] = {first: [], second: []}
            results: dict[str, list[object]] = {first: [], second: []}
            every_event = subjects.stream_filter(subjects.Kind.EVENT, prefix=reader.prefix)
            async for message in reader.read(every_event):
                envelope, payload = decode(message.data)
                if isinstance(payload, NodeUpgradeStateChanged):
                    changes[envelope.node].append(payload)
                elif isinstance(payload, dm.RuntimeConfigured | dm.RuntimeConfigureFailed):
                    results[envelope.node].append(payload)
        finally:
            await reader.close()

    [done] = results[first]
    assert isinstance(done, dm.RuntimeConfigured) and done.changed, done
    [failed] = results[second]
    assert isinstance(failed, dm.RuntimeConfigureFailed), failed
    assert failed.reason is dm.RuntimeFailureReason.NOT_ANSWERING, failed
    path = [c.to_state for c in changes[second]]
    assert UpgradeState.ROLLBACK_REQUIRED in path, path
    assert path[-1] is UpgradeState.UPGRADE_FAILED, path
    assert "did not answer" in changes[second][-1].reason, changes[second][-1].reason
    log = replaying.parse_log(exported)
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
    assert all(code == 0 for code in exit_codes.values()), sorted(exit_codes.items())
