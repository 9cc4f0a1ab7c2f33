"""Nothing is drained for a package that cannot be installed, end to end: a real nats-server,
the simulated cluster (2 nodes of 2 GPUs with GPU workloads), discovery and the
driver-manager as `gpuop run` processes on each node's host root, and the orchestrator.

The driver source has the new driver for node 1's kernel only; node 2 runs another kernel.
`gpuop upgrade start` refuses a version the source lacks altogether (the policy unchanged),
and the new one, which the source lacks for a node's kernel; the policy is then edited as
kubectl would, which only the nodes check. Node 1 is staged, cordoned, drained and
upgraded; node 2's stage fails (no package for its kernel), so its saga ends upgrade-failed
with the reason while node 2 was never cordoned, none of its pods was evicted, and its old
driver still runs. The exported log replays to the same decisions."""

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
from gpuop.events import kube as observed
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.host import modules, packaging
from gpuop.kube import client, customobjects, nodes, pods
from gpuop.policy import crd, specs
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop.services.upgrade_orchestrator import leading
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop_sim import SimCluster
from gpuop_sim.cluster import hosts
from gpuop_sim.host import keys, seeding
from tests.support.cli_runs import cli
from tests.support.processes import DRIVER_LABEL, cluster_discovery, node_agents
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
GPUS = 2
OLD = seeding.RECORDED_DRIVER_VERSION
NEW, ABSENT = "580.200.01", "580.210.02"
KERNEL_A, KERNEL_B = "6.18.44-fc-v657-gpu", "6.18.45-fc-v658-gpu"
CONFIG = OrchestratorConfig(lease_duration_seconds=3, resync_seconds=0.5)


def policy(source: Path) -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": OLD, "source": str(source),
                               "publicKeys": [keys.PUBLIC_KEY]}},
            "upgradePolicy": {
                "maxParallelUpgrades": 2,
                "maxUnavailable": "100%",
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


@pytest.mark.timeout(180)
async def test_a_node_whose_package_cannot_be_staged_fails_uncordoned_with_its_pods(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    exit_codes: dict[str, int | None] = {}
    logs: list[Path] = []
    source = tmp_path / "driver-source"
    packaging.build_driver_source(
        source,
        [("gpu", OLD, KERNEL_A), ("gpu", NEW, KERNEL_A), ("gpu", OLD, KERNEL_B)],
        signing_key=keys.SIGNING_KEY,
    )
    async with SimCluster(nodes=2, gpus=GPUS, workloads=True, seed=5) as cluster:
        first, second = cluster.node_names
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        bus = NatsBus(nats_server.url, name="orchestrator")
        await bus.start()
        roots = {}
        async with AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            for node, kernel in ((first, KERNEL_A), (second, KERNEL_B)):
                machine = cluster.machine(node)
                roots[node] = hosts.build_host_root(
                    tmp_path / f"host-{node}", node, GPUS, gpu_version=OLD,
                    boot_id=machine.boot_id, product_name=machine.type.name,
                    kernel_release=kernel,
                )  # fmt: skip
            await node_agents(stack, tmp_path, nats_server.url, roots, GPUS, logs, exit_codes)
            await cluster_discovery(stack, tmp_path, nats_server.url, kubeconfig, logs, exit_codes)
            kube = await stack.enter_async_context(await client.connect(kubeconfig))

            async def label(node: str, key: str) -> str | None:
                return nodes.labels_of(await nodes.get(kube, node)).get(key)

            async def labelled_old() -> bool:
                return all([await label(n, DRIVER_LABEL) == OLD for n in (first, second)])

            await wait_until("discovery labelling every node", labelled_old, logs, 20)
            workloads = {p["metadata"]["uid"] for p in await pods.gpu_pods_on(kube, second)}
            assert workloads, "node 2 runs GPU workloads"
            definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
            await k8s.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(
                definition
            )
            await customobjects.create(kube, customobjects.GPU_CLUSTER_POLICIES, policy(source))
            await stack.enter_async_context(orchestrator(bus, kube))

            kube_flag = ["--kubeconfig", str(kubeconfig)]
            code, out, err = await cli("upgrade", "start", "--version", ABSENT, *kube_flag)
            assert code == 1, out + err
            assert f"has no gpu {ABSENT} package (it has: {OLD}, {NEW})" in err
            spec = await customobjects.get(kube, customobjects.GPU_CLUSTER_POLICIES, "default")
            assert spec["spec"]["driver"]["gpu"]["version"] == OLD

            # NEW lacks a package for some node's kernel: start refuses it too, so the policy
            # is edited as kubectl would, which nothing checks but the nodes themselves
            code, _, err = await cli("upgrade", "start", "--version", NEW, *kube_flag)
            assert code == 1 and "lack 1 package(s) the nodes need" in err, err
            await customobjects.patch(
                kube,
                customobjects.GPU_CLUSTER_POLICIES,
                "default",
                {"spec": {"driver": {"gpu": {"version": NEW}}}},
            )

            async def settled() -> bool:
                return (await label(first, STATE_LABEL), await label(second, STATE_LABEL)) == (
                    UpgradeState.UPGRADE_DONE.value,
                    UpgradeState.UPGRADE_FAILED.value,
                )

            await wait_until("node 1 done and node 2 failed", settled, logs, 60)
            second_node = await nodes.get(kube, second)
            assert not (second_node.get("spec") or {}).get("unschedulable")
            running = {p["metadata"]["uid"] for p in await pods.gpu_pods_on(kube, second)}
            assert workloads <= running, "a GPU workload of node 2 was evicted"
            assert modules.module_version(roots[second], "nvidia") == OLD

        reader = NatsBus(nats_server.url, name="reader")
        await reader.start()
        try:
            exported = await export_lines(reader)
            changes: dict[str, list[NodeUpgradeStateChanged]] = {first: [], second: []}
            touched_second: list[object] = []
            every_event = subjects.stream_filter(subjects.Kind.EVENT, prefix=reader.prefix)
            async for message in reader.read(every_event):
                envelope, payload = decode(message.data)
                if isinstance(payload, NodeUpgradeStateChanged):
                    changes[envelope.node].append(payload)
                elif envelope.node == second and isinstance(
                    payload, observed.NodeCordoned | observed.PodsDeleted | observed.DrainCompleted
                    | dm.DriverUnloaded | dm.DriverInstalled,
                ):  # fmt: skip
                    touched_second.append(payload)
        finally:
            await reader.close()

    assert touched_second == [], "node 2 was touched although its package could not be staged"
    path = [c.to_state for c in changes[second]]
    assert path == [UpgradeState.CORDON_REQUIRED, UpgradeState.UPGRADE_FAILED], path
    reason = changes[second][-1].reason
    assert "DriverStageFailed gpu" in reason and KERNEL_B in reason, reason
    assert [c.to_state for c in changes[first]][-1] is UpgradeState.UPGRADE_DONE
    log = replaying.parse_log(exported)
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
    assert all(code == 0 for code in exit_codes.values()), sorted(exit_codes.items())
