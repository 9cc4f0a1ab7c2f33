"""`gpuop sim apiserver` as a newcomer runs it: a real process, the official client from
its kubeconfig, a cordon and a drain by eviction, and a clean stop on a signal."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from kubernetes.aio import client, watch
from kubernetes.aio.client.exceptions import ApiException

from gpuop_sim.apiserver import kubeconfig as kubeconfigs
from tests.integration.sim.clusters import controller_kind, official_client
from tests.support.waiting import eventually

GPUOP = [sys.executable, "-m", "gpuop.cli.main"]


@asynccontextmanager
async def sim_apiserver(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        *GPUOP, "sim", "apiserver", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def wait_for_kubeconfig(process: asyncio.subprocess.Process) -> str:
    """What the command printed up to the line naming its kubeconfig, written by then."""
    assert process.stdout is not None
    printed = ""
    while not printed.endswith("\n") or "kubeconfig:" not in printed.splitlines()[-1]:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line, f"gpuop sim apiserver exited early: {printed}"
        printed += line.decode()
    return printed


def trusting(kubeconfig: Path) -> aiohttp.ClientSession:
    """A raw HTTPS session trusting the CA the kubeconfig carries."""
    connector = aiohttp.TCPConnector(ssl=kubeconfigs.ssl_context(kubeconfig))
    return aiohttp.ClientSession(connector=connector)


async def stop(process: asyncio.subprocess.Process, signum: int) -> tuple[int, str]:
    process.send_signal(signum)
    out, _ = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def all_running(core: client.CoreV1Api) -> list[client.V1Pod] | None:
    pods = (await core.list_pod_for_all_namespaces()).items
    return pods if pods and all(p.status.phase == "Running" for p in pods) else None


async def evict(core: client.CoreV1Api, pod: client.V1Pod) -> None:
    """Evict like `kubectl drain`: retry while a disruption budget answers 429."""
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace)
    )
    for _ in range(200):
        try:
            await core.create_namespaced_pod_eviction(
                pod.metadata.name, pod.metadata.namespace, body
            )
            return
        except ApiException as error:
            if error.status != 429:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError(f"could not evict {pod.metadata.name}")


async def test_a_newcomer_lists_cordons_and_drains_a_node_then_stops_it(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    async with sim_apiserver(
        "--nodes", "3", "--gpus", "8", "--kubeconfig-out", str(kubeconfig)
    ) as process:
        announced = await wait_for_kubeconfig(process)
        async with official_client(kubeconfig) as api:
            core = client.CoreV1Api(api)
            nodes = (await core.list_node()).items
            await eventually(lambda: all_running(core), timeout=10)

            await core.patch_node("gpu-node-1", {"spec": {"unschedulable": True}})
            on_node = await core.list_pod_for_all_namespaces(
                field_selector="spec.nodeName=gpu-node-1"
            )
            drained = [p for p in on_node.items if controller_kind(p) != "DaemonSet"]
            names = {p.metadata.name for p in drained}
            gone: set[str] = set()
            async with watch.Watch() as stream:
                await asyncio.gather(*(evict(core, pod) for pod in drained))
                async for event in stream.stream(
                    core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName=gpu-node-1",
                    resource_version=on_node.metadata.resource_version,
                    timeout_seconds=15,
                ):
                    if event["type"] == "DELETED":
                        gone.add(event["object"].metadata.name)
                    if gone >= names:
                        break
            remaining = await core.list_pod_for_all_namespaces(
                field_selector="spec.nodeName=gpu-node-1"
            )
            replacements = await eventually(lambda: all_running(core), timeout=10)
        code, out = await stop(process, signal.SIGTERM)

    assert [n.metadata.name for n in nodes] == ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    assert all(n.status.capacity["nvidia.com/gpu"] == "8" for n in nodes)
    assert names and gone >= names
    assert {controller_kind(p) for p in remaining.items} == {"DaemonSet"}
    moved = [p for p in replacements if controller_kind(p) in ("ReplicaSet", "Job")]
    assert len(moved) >= len(drained)
    assert all(p.spec.node_name != "gpu-node-1" for p in moved)
    assert code == 0
    assert f"kubeconfig: {kubeconfig}" in announced
    assert f"kubectl --kubeconfig {kubeconfig} get nodes" in out
    assert "stopped" in out


async def test_without_workloads_it_serves_clients_without_a_token_and_stops_on_ctrl_c(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "kc"
    async with sim_apiserver(
        "--nodes", "1", "--gpus", "4", "--no-workloads", "--kubeconfig-out", str(kubeconfig)
    ) as process:
        await wait_for_kubeconfig(process)
        async with official_client(kubeconfig) as api:
            core = client.CoreV1Api(api)
            node = await core.read_node("gpu-node-1")
            pods = (await core.list_pod_for_all_namespaces()).items
            host = api.configuration.host
        async with trusting(kubeconfig) as session:
            async with session.get(f"{host}/api/v1/nodes") as anonymous:
                anonymous_status = anonymous.status
            wrong = {"Authorization": "Bearer wrong"}
            async with session.get(f"{host}/api/v1/nodes", headers=wrong) as refused:
                refused_status = refused.status
        code, _ = await stop(process, signal.SIGINT)

    assert node.status.capacity["nvidia.com/gpu"] == "4"
    assert pods == []
    assert (anonymous_status, refused_status) == (200, 401)
    assert code == 0


async def test_negative_sizes_are_a_usage_error(tmp_path: Path) -> None:
    async with sim_apiserver("--nodes", "-1", "--kubeconfig-out", str(tmp_path / "kc")) as process:
        out, _ = await asyncio.wait_for(process.communicate(), 20)

    assert process.returncode == 2
    assert "--nodes -1" in out.decode()


async def test_fault_flags_make_the_api_fail_on_purpose_but_never_its_health_checks(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "kc"
    async with sim_apiserver(
        "--nodes", "1", "--no-workloads", "--kubeconfig-out", str(kubeconfig),
        "--error-rate", "1", "--watch-drop-seconds", "30",
    ) as process:  # fmt: skip
        announced = await wait_for_kubeconfig(process)
        async with official_client(kubeconfig) as api:
            host = api.configuration.host
        async with trusting(kubeconfig) as session:
            async with session.get(f"{host}/api/v1/nodes") as faulted:
                status, body = faulted.status, await faulted.json()
            async with session.get(f"{host}/readyz") as ready:
                ready_status = ready.status
        code, _ = await stop(process, signal.SIGTERM)

    assert "faults: 100% of requests answer 500, watches end after 30s on average" in announced
    assert (status, body["reason"]) == (500, "InternalError")
    assert ready_status == 200
    assert code == 0
