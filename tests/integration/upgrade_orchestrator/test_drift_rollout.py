"""Kernel drift and new nodes end to end: a real nats-server, the simulated cluster, on every
node discovery and the driver-manager as `gpuop run` processes on its own host root,
discovery's cluster role and the upgrade orchestrator, as in `test_rollout`.

Three nodes: two run the old driver, one has no driver and no GPU pods (a new node). The
policy asks for a new driver with `maxParallelUpgrades: 1, maxUnavailable: 1`: the new node
is brought up beside the upgrade that holds the one slot, behind the driver-not-ready taint
instead of a cordon, and the taint goes once its driver validated. One upgraded node had a
second kernel installed before its install: the driver was pre-staged for it, and a reboot
into it comes up with the driver, starting nothing. The other gets a kernel update after the
rollout and reboots into it without a driver: the orchestrator reinstalls it (reason
`kernel-drift`) without any policy change."""

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
from gpuop.events import kube as observed
from gpuop.events.upgrade import (
    DRIVER_NOT_READY_TAINT,
    NodeUpgradeStateChanged,
    SagaReason,
    SagaStarted,
    UpgradeState,
)
from gpuop.host import modules, packaging, system
from gpuop.host.roots import HostRoot
from gpuop.kube import client, nodes
from gpuop.policy import crd, specs
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop.services.upgrade_orchestrator import leading
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop_sim import SimCluster
from gpuop_sim.cluster import hosts
from gpuop_sim.host import keys, seeding
from gpuop_sim.host.simkernel import SimKernel
from tests.support.processes import cluster_discovery, node_agents
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
GPUS = 2
OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
NEXT_KERNEL = "6.18.50-fc-v660-gpu"
TIMEOUT = 60.0
CONFIG = OrchestratorConfig(lease_duration_seconds=3, resync_seconds=0.5)
D = UpgradeState.UPGRADE_DONE


def policy(source: Path) -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {
                "gpu": {"version": NEW, "source": str(source), "publicKeys": [keys.PUBLIC_KEY]}
            },
            "upgradePolicy": {
                "maxParallelUpgrades": 1,
                "maxUnavailable": 1,
                "drain": {"enable": True, "force": True, "deleteEmptyDir": True},
            },
        },
    }


def install_kernel(root: HostRoot, release: str) -> None:
    """A kernel package's install: its modules directory, not booted yet."""
    (root.join(f"lib/modules/{release}") / "kernel").mkdir(parents=True)


def reboot_into(root: HostRoot, release: str) -> None:
    """The node reboots into `release`; its GPU driver loads at boot if that kernel has it."""
    running = system.kernel_release(root)
    assert running is not None
    root.join(system.OSRELEASE).write_text(release + "\n")
    version = root.join(system.PROC_VERSION)
    version.write_text(version.read_text().replace(running, release, 1))
    SimKernel(root).reboot(load=("nvidia", "nvidia_uvm"))


@contextlib.asynccontextmanager
async def orchestrator(bus: NatsBus, kube: client.Kube) -> AsyncIterator[None]:
    stopping = asyncio.Event()
    task = asyncio.create_task(leading.lead(bus, kube, CONFIG, stopping, identity="replica"))
    try:
        yield
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)


async def test_new_nodes_and_kernel_drift_need_no_policy_change(
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

    async with SimCluster(nodes=3, gpus=GPUS, workloads=False, seed=5) as cluster:
        upgraded, staged, new = cluster.node_names
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        source = tmp_path / "driver-source"
        roots: dict[str, HostRoot] = {}
        bus = NatsBus(nats_server.url, name="orchestrator")
        await bus.start()
        async with AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            for node in cluster.node_names:
                machine = cluster.machine(node)
                root = hosts.build_host_root(
                    tmp_path / f"host-{node}", node, GPUS,
                    gpu_version=None if node == new else OLD,
                    boot_id=machine.boot_id, product_name=machine.type.name,
                )  # fmt: skip
                roots[node] = root
                if not source.exists():
                    kernel = system.kernel_release(root)
                    assert kernel is not None
                    packaging.build_driver_source(
                        source,
                        [("gpu", OLD, kernel), ("gpu", NEW, kernel), ("gpu", NEW, NEXT_KERNEL)],
                        signing_key=keys.SIGNING_KEY,
                    )
            await node_agents(stack, tmp_path, nats_server.url, roots, GPUS, logs, exit_codes)
            install_kernel(roots[staged], NEXT_KERNEL)  # installed, to be booted later
            await cluster_discovery(stack, tmp_path, nats_server.url, kubeconfig, logs, exit_codes)
            kube = await stack.enter_async_context(await client.connect(kubeconfig))

            async def labels() -> dict[str, dict[str, str]]:
                return {n: nodes.labels_of(await nodes.get(kube, n)) for n in cluster.node_names}

            async def discovered() -> bool:
                found = await labels()
                return all("nvidia.com/gpu.present" in found[n] for n in cluster.node_names)

            await wait_until("discovery labelling every node", discovered)
            definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
            await k8s.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(
                definition
            )
            await kube.call(
                kube.custom_objects.create_cluster_custom_object,
                specs.GROUP, specs.VERSION, specs.PLURAL, policy(source),
            )  # fmt: skip

            async def all_done() -> bool:
                found = await labels()
                return all(found[n].get(STATE_LABEL) == D.value for n in cluster.node_names)

            async with orchestrator(bus, kube):
                await wait_until("every node upgrade-done", all_done)
                taints = (await nodes.get(kube, new)).get("spec", {}).get("taints") or []
                assert not [t for t in taints if t.get("key") == DRIVER_NOT_READY_TAINT]
                assert modules.module_version(roots[new], "nvidia") == NEW

                # the staged node reboots into the kernel it got before its install
                reboot_into(roots[staged], NEXT_KERNEL)
                assert modules.module_version(roots[staged], "nvidia") == NEW
                # the other gets a kernel update after the rollout, and reboots into it
                install_kernel(roots[upgraded], NEXT_KERNEL)
                reboot_into(roots[upgraded], NEXT_KERNEL)
                assert modules.module_version(roots[upgraded], "nvidia") is None

                async def reinstalled() -> bool:
                    return modules.module_version(roots[upgraded], "nvidia") == NEW

                await wait_until("the drifted node running the driver again", reinstalled)
                await wait_until("every node upgrade-done again", all_done)

        started: dict[str, list[SagaStarted]] = defaultdict(list)
        paths: dict[str, list[tuple[UpgradeState, str]]] = defaultdict(list)
        under_way: list[set[str]] = []
        cordoned: set[str] = set()
        reader = NatsBus(nats_server.url, name="reader")
        await reader.start()
        try:
            exported = await export_lines(reader)
            async for message in reader.read(subjects.events_filter("upgrade", name="*")):
                envelope, payload = decode(message.data)
                if isinstance(payload, SagaStarted):
                    started[envelope.node].append(payload)
                elif isinstance(payload, NodeUpgradeStateChanged):
                    paths[envelope.node].append((payload.to_state, payload.reason))
                    resting = (UpgradeState.UPGRADE_REQUIRED, D)
                    under_way.append({n for n, p in paths.items() if p[-1][0] not in resting})
            async for message in reader.read(subjects.events_filter("kube", name="cordoned")):
                envelope, payload = decode(message.data)
                if isinstance(payload, observed.NodeCordoned):
                    cordoned.add(envelope.node)
        finally:
            await reader.close()

    # the reasons, the bring-up and the reinstall are in the log: a replay decides the same
    log = replaying.parse_log(exported)
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
    assert [s.reason for s in started[new]] == [SagaReason.NO_DRIVER]
    assert started[new][0].bring_up
    assert new not in cordoned, "a new node is tainted, never cordoned"
    assert any(new in nodes_ and len(nodes_ - {new}) == 1 for nodes_ in under_way), (
        "the new node was not brought up beside the upgrade holding the one slot"
    )
    assert max(len(nodes_ - {new}) for nodes_ in under_way) == 1, "maxParallelUpgrades 1 broken"
    assert [s.reason for s in started[staged]] == [SagaReason.VERSION_CHANGE]
    reasons = [s.reason for s in started[upgraded]]
    assert reasons == [SagaReason.VERSION_CHANGE, SagaReason.KERNEL_DRIFT]
    drift = started[upgraded][1]
    assert drift.kernel_release == NEXT_KERNEL and drift.saga_id != started[upgraded][0].saga_id
    assert [state for state, _ in paths[upgraded]].count(D) == 2
    assert all(code == 0 for code in exit_codes.values()), sorted(exit_codes.items())
