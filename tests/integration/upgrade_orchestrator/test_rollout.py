"""A rolling driver upgrade end to end: a real nats-server, the simulated cluster (3 nodes
of 2 GPUs, with GPU workloads under PodDisruptionBudgets), on every node discovery and the
driver-manager as `gpuop run` processes on its own host root, discovery's cluster role, and
the upgrade orchestrator (leader-elected, as coroutines). A GPUClusterPolicy asking for a
new GPU driver starts the rollout; the first replica stops once a node is done and a second
one takes the rollout over from KV; the outcome is read from the event log and the Nodes,
and the exported log replays to the same decisions (and diverges under another policy)."""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from gpuop.events.hardware import HardwareDiscovered
from gpuop.events.upgrade import NodeUpgradeStateChanged, RolloutCompleted, UpgradeState
from gpuop.host import packaging, system
from gpuop.kube import client, customobjects, nodes
from gpuop.policy import crd, specs
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop.services.upgrade_orchestrator import leading
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop_sim import SimCluster
from gpuop_sim.cluster import hosts
from gpuop_sim.host import keys, seeding
from tests.support.processes import DRIVER_LABEL, cluster_discovery, node_agents
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
NODES, GPUS = 3, 2
OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
ROLLOUT_TIMEOUT = 50.0
CONFIG = OrchestratorConfig(lease_duration_seconds=3, resync_seconds=0.5)
SIGNED = {"publicKeys": [keys.PUBLIC_KEY]}
"""The built source is signed with the simulation's key."""


def policy(source: Path) -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": NEW, "source": str(source), **SIGNED}},
            "upgradePolicy": {
                "maxParallelUpgrades": 1,
                "maxUnavailable": 1,
                "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 30},
                "drain": {
                    "enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 30
                },
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
async def orchestrator(bus: NatsBus, kube: client.Kube, identity: str) -> AsyncIterator[None]:
    """One replica of the orchestrator, as a coroutine, stopped (lease released) on exit."""
    stopping = asyncio.Event()
    task = asyncio.create_task(
        leading.lead(bus, kube, CONFIG, stopping, identity=identity), name=identity
    )
    try:
        yield
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)


async def test_a_new_gpu_driver_in_the_policy_rolls_across_every_node(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    exit_codes: dict[str, int | None] = {}
    logs: list[Path] = []
    async with SimCluster(nodes=NODES, gpus=GPUS, workloads=True, seed=5) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        source = tmp_path / "driver-source"
        bus = NatsBus(nats_server.url, name="orchestrator")
        await bus.start()
        async with AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            roots = {}
            for node in cluster.node_names:
                machine = cluster.machine(node)
                roots[node] = hosts.build_host_root(
                    tmp_path / f"host-{node}", node, GPUS, gpu_version=OLD,
                    boot_id=machine.boot_id, product_name=machine.type.name,
                )  # fmt: skip
            kernel = system.kernel_release(roots[cluster.node_names[0]])
            assert kernel is not None
            packaging.build_driver_source(
                source, [("gpu", OLD, kernel), ("gpu", NEW, kernel)], signing_key=keys.SIGNING_KEY
            )
            await node_agents(stack, tmp_path, nats_server.url, roots, GPUS, logs, exit_codes)
            await cluster_discovery(stack, tmp_path, nats_server.url, kubeconfig, logs, exit_codes)
            kube = await stack.enter_async_context(await client.connect(kubeconfig))

            async def labelled(key: str, value: str) -> bool:
                found = [nodes.labels_of(await nodes.get(kube, n)) for n in cluster.node_names]
                return all(labels.get(key) == value for labels in found)

            await wait_until(
                "discovery labelling every node", lambda: labelled(DRIVER_LABEL, OLD), logs, 20
            )
            definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
            await k8s.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(
                definition
            )
            await kube.call(
                kube.custom_objects.create_cluster_custom_object,
                specs.GROUP, specs.VERSION, specs.PLURAL, policy(source),
            )  # fmt: skip

            async def any_done() -> bool:
                found = [nodes.labels_of(await nodes.get(kube, n)) for n in cluster.node_names]
                return any(labels.get(STATE_LABEL) == UpgradeState.UPGRADE_DONE for labels in found)

            first = AsyncExitStack()
            await first.enter_async_context(orchestrator(bus, kube, "replica-a"))
            try:
                await wait_until("a first node upgrade-done", any_done, logs, ROLLOUT_TIMEOUT)
                async with orchestrator(bus, kube, "replica-b"):
                    await first.aclose()  # replica-a stops mid-rollout; replica-b takes over
                    await wait_until(
                        "every node upgrade-done",
                        lambda: labelled(STATE_LABEL, UpgradeState.UPGRADE_DONE.value),
                        logs,
                        ROLLOUT_TIMEOUT,
                    )
                    await wait_until(
                        "the new driver labels", lambda: labelled(DRIVER_LABEL, NEW), logs, 15
                    )
                    stored: dict[str, Any] = {}

                    async def status_counts_done() -> bool:
                        stored.update(
                            await customobjects.get(
                                kube, customobjects.GPU_CLUSTER_POLICIES, "default"
                            )
                        )
                        nodes_by_state = (stored.get("status") or {}).get("nodes")
                        return bool(nodes_by_state == {UpgradeState.UPGRADE_DONE.value: NODES})

                    await wait_until("the policy status counting every node done",
                                     status_counts_done, logs, 10)  # fmt: skip
                    lease = await kube.call(
                        kube.coordination.read_namespaced_lease, CONFIG.lease_name, "default"
                    )
            finally:
                await first.aclose()

        states: dict[str, list[UpgradeState]] = defaultdict(list)
        in_maintenance: list[int] = []
        """Nodes between admission and upgrade-done after each transition, in log order."""
        completed: list[RolloutCompleted] = []
        reader = NatsBus(nats_server.url, name="reader")
        await reader.start()
        try:
            exported = await export_lines(reader)
            async for message in reader.read(subjects.events_filter("upgrade", name="*")):
                envelope, payload = decode(message.data)
                if isinstance(payload, NodeUpgradeStateChanged):
                    states[envelope.node].append(payload.to_state)
                    resting = (UpgradeState.UPGRADE_REQUIRED, UpgradeState.UPGRADE_DONE)
                    in_maintenance.append(sum(path[-1] not in resting for path in states.values()))
                elif isinstance(payload, RolloutCompleted):
                    completed.append(payload)
        finally:
            await reader.close()

    assert lease["spec"]["holderIdentity"] == "replica-b"
    # the recorded log, taken over mid-rollout, replays to the same decisions
    log = replaying.parse_log(exported)
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()
    assert replayed.nodes == set(cluster.node_names) and comparison.transitions >= 9 * NODES
    changed = specs.GPUClusterPolicySpec.model_validate(
        {
            **policy(source)["spec"],
            "driver": {"gpu": {"version": "590.1", "source": str(source), **SIGNED}},
        }
    )
    assert not replaying.compare(
        replaying.recorded_outputs(log), replaying.replay(log, changed).outputs
    ).identical
    # the validation ladder's default rungs, in the exported log: NVML and CUDA from each
    # node's driver-manager, the operands resumed, and the pod run on the cordoned node
    rungs: dict[str, list[str]] = defaultdict(list)
    for line in exported:
        entry = json.loads(line)
        data, node = entry["message"]["data"], entry["subject"].split(".")[3]
        if entry["subject"].endswith(".validate"):
            rungs[node].append(f"validate {data.get('check', 'nvml')}")
        elif entry["subject"].endswith((".resume", ".validation-pod-succeeded")):
            rungs[node].append(entry["subject"].rsplit(".", 1)[1])
    assert rungs == {
        node: ["validate nvml", "validate cuda", "resume", "validation-pod-succeeded"]
        for node in cluster.node_names
    }
    assert set(states) == set(cluster.node_names)
    for node, path in states.items():
        assert path[-1] is UpgradeState.UPGRADE_DONE, (node, path)
        assert UpgradeState.DRAIN_REQUIRED in path and UpgradeState.UPGRADE_FAILED not in path
        assert path.index(UpgradeState.VALIDATION_REQUIRED) < path.index(
            UpgradeState.UNCORDON_REQUIRED
        ), "uncordoned before the new driver validated"
    assert max(in_maintenance) == 1, "maxParallelUpgrades 1 and maxUnavailable 1 were exceeded"
    assert [c.done for c in completed] == [NODES]
    conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
    assert conditions == {
        "Valid": "True",
        "Progressing": "False",
        "Ready": "True",
        "RemediationBreaker": "False",
    }
    assert all(code == 0 for code in exit_codes.values()), sorted(exit_codes.items())


BRANCH_OLD, AMD64_NEW, ARM64_NEW = "535.261.03", "550.163.01", "550.144.03"
KERNELS = {"amd64": "6.1.0-57-amd64", "arm64": "6.1.0-57-arm64"}


def mixed_policy(source: Path) -> dict[str, Any]:
    """550 on the amd64 nodes (the default), a version of its own pinned on the arm64 ones by
    a pool that selects them by the kubelet's `kubernetes.io/arch` label."""
    document = policy(source)
    document["spec"]["driver"] = {
        "gpu": {"version": AMD64_NEW, "source": str(source), **SIGNED},
        "pools": [
            {
                "name": "arm64",
                "nodeSelector": "kubernetes.io/arch=arm64",
                "gpu": {"version": ARM64_NEW, "source": str(source), **SIGNED},
            }
        ],
    }
    return document


async def test_a_mixed_amd64_and_arm64_fleet_moves_from_535_to_550_per_architecture(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """One amd64 and one arm64 node (Debian's kernels of each, the arm64 host root saying
    aarch64 and its Node labelled arm64) run 535; the policy asks for 550 and pins the arm64
    pool's own 550 version: each node's saga installs the package of its kernel and both
    end upgrade-done, discovery reporting each node's architecture."""
    exit_codes: dict[str, int | None] = {}
    logs: list[Path] = []
    source = tmp_path / "driver-source"
    packaging.build_driver_source(
        source,
        [
            ("gpu", version, KERNELS[arch])
            for arch, new in (("amd64", AMD64_NEW), ("arm64", ARM64_NEW))
            for version in (BRANCH_OLD, new)
        ],
        signing_key=keys.SIGNING_KEY,
    )
    async with SimCluster(nodes=2, gpus=GPUS, workloads=True, seed=5) as cluster:
        arches = dict(zip(cluster.node_names, ("amd64", "arm64"), strict=True))
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        bus = NatsBus(nats_server.url, name="orchestrator")
        await bus.start()
        async with AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            kube = await stack.enter_async_context(await client.connect(kubeconfig))
            roots = {}
            for node, arch in arches.items():
                machine = cluster.machine(node)
                roots[node] = hosts.build_host_root(
                    tmp_path / f"host-{node}", node, GPUS, gpu_version=BRANCH_OLD,
                    boot_id=machine.boot_id, product_name=machine.type.name,
                    kernel_release=KERNELS[arch],
                )  # fmt: skip
                uname_m = roots[node].join(system.ARCH)
                uname_m.parent.mkdir(parents=True, exist_ok=True)
                uname_m.write_text("aarch64\n" if arch == "arm64" else "x86_64\n")
                await nodes.set_labels(kube, node, {"kubernetes.io/arch": arch})
            await node_agents(stack, tmp_path, nats_server.url, roots, GPUS, logs, exit_codes)
            await cluster_discovery(stack, tmp_path, nats_server.url, kubeconfig, logs, exit_codes)

            async def running(expected: dict[str, str], state: str | None = None) -> bool:
                found = {n: nodes.labels_of(await nodes.get(kube, n)) for n in arches}
                return all(
                    labels.get(DRIVER_LABEL) == expected[n] and labels.get(STATE_LABEL) == state
                    for n, labels in found.items()
                )

            old = dict.fromkeys(arches, BRANCH_OLD)
            await wait_until("discovery labelling 535", lambda: running(old), logs, 20)
            definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
            await k8s.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(
                definition
            )
            await customobjects.create(
                kube, customobjects.GPU_CLUSTER_POLICIES, mixed_policy(source)
            )
            new = {n: AMD64_NEW if a == "amd64" else ARM64_NEW for n, a in arches.items()}
            done = UpgradeState.UPGRADE_DONE.value
            async with orchestrator(bus, kube, "replica-a"):
                await wait_until(
                    "each node upgrade-done on its 550", lambda: running(new, done), logs, 120
                )

        machines: dict[str, set[str]] = defaultdict(set)
        reader = NatsBus(nats_server.url, name="reader")
        await reader.start()
        try:
            async for message in reader.read(subjects.events_filter("hardware", name="*")):
                envelope, payload = decode(message.data)
                if isinstance(payload, HardwareDiscovered):
                    machines[envelope.node].add(payload.machine)
        finally:
            await reader.close()
    assert {n: machines[n] for n in arches} == {
        n: {"aarch64" if a == "arm64" else "x86_64"} for n, a in arches.items()
    }
    assert all(code == 0 for code in exit_codes.values()), sorted(exit_codes.items())
