"""`gpuop upgrade` against the simulated API server with the real CRD and a policy (and a real
nats-server for what it reads from the event log): start, pause, resume and abort change the
policy as their help says; status and plan read it; errors exit 1 or 2 with a message that
says what is wrong."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import NatsBus, NatsServer
from gpuop.cli import controls
from gpuop.events import new_event, subjects
from gpuop.events import upgrade as up
from gpuop.events.driver import Component
from gpuop.kube import client, customobjects, nodes
from gpuop.kube.recording import EventRecorder
from gpuop.policy import specs
from gpuop.saga.actions import STATE_LABEL
from gpuop.saga.remediation.actions import REPLACEMENT_LABEL, MarkReplacement
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop_sim import ApiServer
from gpuop_sim.apiserver.kubeconfig import write_kubeconfig
from tests.support.cli_runs import cli
from tests.support.processes import free_port, gpuop
from tests.support.rollouts import install_crd
from tests.support.sagas import T0

OLD, NEW = "580.159.04", "580.200.01"
DRIVER = "nvidia.com/cuda.driver-version.full"
RESOURCE = customobjects.GPU_CLUSTER_POLICIES
# What the API server stores for a gpu driver whose kernelModuleType is unset (the CRD's default)
AUTO = {"kernelModuleType": "auto"}
POOLS = {"gpu-node-1": "train", "gpu-node-2": "train", "gpu-node-3": "train"}
POOLS |= {"gpu-node-4": "infer", "gpu-node-5": "infer"}


@dataclass
class Cluster:
    server: ApiServer
    kube: client.Kube
    kubeconfig: Path

    async def cli(self, *argv: str) -> tuple[int, str, str]:
        return await cli(*argv, "--kubeconfig", str(self.kubeconfig))

    async def policy(self) -> dict[str, Any]:
        return await customobjects.get(self.kube, RESOURCE, "default")

    async def spec(self) -> dict[str, Any]:
        return dict((await self.policy())["spec"])

    async def label(self, node: str, **labels: str) -> None:
        await nodes.set_labels(self.kube, node, labels)


def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def policy(version: str = OLD, **upgrade: Any) -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": version, "source": "/srv/drivers"}},
            "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%", **upgrade},
        },
    }


async def create_policy(kube: client.Kube, body: dict[str, Any]) -> None:
    await customobjects.create(kube, RESOURCE, body)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Five GPU nodes running OLD (three in pool train), the CRD and a policy asking for OLD."""
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        for name, pool in POOLS.items():
            labels = {"nvidia.com/gpu.present": "true", "pool": pool, DRIVER: OLD}
            server.seed(node(name, labels))
        async with await client.connect(kubeconfig) as kube:
            await install_crd(kube)
            await create_policy(kube, policy())
            yield Cluster(server, kube, kubeconfig)


async def test_start_asks_for_the_version_with_its_limits_and_nodes(cluster: Cluster) -> None:
    await customobjects.patch(
        cluster.kube, RESOURCE, "default", {"spec": {"upgradePolicy": {"paused": True}}}
    )
    code, out, err = await cluster.cli(
        "upgrade", "start", "--version", NEW, "--max-parallel", "2", "--selector", "pool=train",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    assert document["changed"] and document["selectedNodes"] == 3
    assert document["summary"] == f"gpu driver {OLD} -> {NEW}"
    spec = await cluster.spec()
    assert spec["driver"]["gpu"] == {"version": NEW, "source": "/srv/drivers", **AUTO}
    upgrade = spec["upgradePolicy"]
    assert (upgrade["maxParallelUpgrades"], upgrade["nodeSelector"]) == (2, "pool=train")
    assert upgrade["paused"] is False  # starting a rollout also resumes it
    annotations = (await cluster.policy())["metadata"]["annotations"]
    remembered = json.loads(annotations[controls.LAST_START])
    assert remembered["from"]["gpu"]["version"] == OLD and remembered["to"]["gpu"]["version"] == NEW

    code, out, _ = await cluster.cli("upgrade", "start", "--version", NEW)
    assert code == 0 and f"gpu driver {NEW} already asked for" in out
    assert "nodes: 3 of 5 GPU nodes (pool=train)" in out


async def test_start_of_the_ofed_driver_adds_the_component(cluster: Cluster) -> None:
    code, _, err = await cluster.cli(
        "upgrade", "start", "--component", "ofed", "--version", "25.04-0.6.1.0",
        "--source", "https://127.0.0.1:9/ofed",
    )  # fmt: skip
    assert code == 0, err
    ofed = (await cluster.spec())["driver"]["ofed"]
    assert ofed == {"version": "25.04-0.6.1.0", "source": "https://127.0.0.1:9/ofed"}


async def test_pause_and_resume_set_and_clear_paused(cluster: Cluster) -> None:
    code, out, _ = await cluster.cli("upgrade", "pause")
    assert code == 0 and "paused: no node is admitted" in out
    assert (await cluster.spec())["upgradePolicy"]["paused"] is True
    code, out, _ = await cluster.cli("upgrade", "pause", "--json")
    assert code == 0 and json.loads(out)["changed"] is False
    await cluster.label("gpu-node-2", **{STATE_LABEL: "drain-required"})
    code, out, _ = await cluster.cli("upgrade", "resume")
    assert code == 0 and "resumed" in out and "under way: gpu-node-2" in out
    assert (await cluster.spec())["upgradePolicy"]["paused"] is False


async def test_abort_goes_back_to_the_versions_start_replaced_once(cluster: Cluster) -> None:
    code, _, err = await cluster.cli(
        "upgrade", "start", "--version", NEW, "--source", "https://127.0.0.1:9/gpu"
    )
    assert code == 0, err
    assert (await cluster.cli("upgrade", "pause"))[0] == 0

    code, out, err = await cluster.cli("upgrade", "abort", "--json")
    assert code == 0, err
    assert json.loads(out)["summary"].startswith(f"back to gpu {OLD}")
    policy = await cluster.policy()
    assert policy["spec"]["driver"]["gpu"] == {"version": OLD, "source": "/srv/drivers", **AUTO}
    assert policy["spec"]["upgradePolicy"]["paused"] is False
    assert controls.LAST_START not in (policy["metadata"].get("annotations") or {})

    code, _, err = await cluster.cli("upgrade", "abort")
    assert code == 1 and "nothing to abort" in err and "gpuop upgrade start --version" in err


async def test_status_counts_the_nodes_by_their_state(cluster: Cluster) -> None:
    await customobjects.patch(
        cluster.kube, RESOURCE, "default", {"spec": {"driver": {"gpu": {"version": NEW}}}}
    )
    await cluster.label("gpu-node-1", **{STATE_LABEL: "upgrade-done", DRIVER: NEW})
    await cluster.label("gpu-node-2", **{STATE_LABEL: "drain-required"})
    await cluster.label("gpu-node-3", **{STATE_LABEL: "upgrade-done"})  # an earlier rollout's
    await cluster.label("gpu-node-5", **{STATE_LABEL: "upgrade-failed"})
    status = {
        "conditions": [
            {
                "type": "Progressing", "status": "True", "reason": "RolloutInProgress",
                "message": "1 of 5 nodes upgraded", "lastTransitionTime": "2026-03-01T12:00:00Z",
            }
        ],
        "nodes": {"upgrade-done": 1},
    }  # fmt: skip
    await customobjects.patch_status(cluster.kube, RESOURCE, "default", status)

    code, out, err = await cluster.cli("upgrade", "status", "--json")
    assert code == 0, err
    document = json.loads(out)
    states = {n["node"]: n["state"] for n in document["nodes"]}
    assert states == {
        "gpu-node-1": "upgrade-done",
        "gpu-node-2": "drain-required",
        "gpu-node-3": "upgrade-required",
        "gpu-node-4": "upgrade-required",
        "gpu-node-5": "upgrade-failed",
    }
    assert document["summary"]["nodes"] == 5
    assert (document["summary"]["done"], document["summary"]["failed"]) == (1, 1)
    assert document["policy"]["versions"] == {"gpu": NEW}
    assert document["policy"]["conditions"][0]["reason"] == "RolloutInProgress"

    code, out, _ = await cluster.cli("upgrade", "status")
    assert code == 0
    assert "GPUClusterPolicy default: gpu 580.200.01, maxParallelUpgrades 1" in out
    assert "NODE        STATE             DRIVER      ATTEMPT  REASON" in out
    assert "5 nodes: 2 upgrade-required, 1 drain-required, 1 upgrade-done, 1 upgrade-failed" in out


async def publish_rollout(url: str) -> None:
    """A past rollout of two nodes, as the orchestrator tells it, plus one still under way."""
    bus = NatsBus(url, name="recorder")
    await bus.start()
    rollout = "rollout-gpu-580.200.01"
    targets = {Component.GPU: NEW}
    envelopes = [
        new_event(up.PolicyApplied(spec=policy(NEW)["spec"]), node=subjects.CLUSTER,
                  source="test", now=T0),
        new_event(up.RolloutStarted(rollout_id=rollout, trigger=up.RolloutTrigger.POLICY,
                                    target_versions=targets, total=3, max_parallel_upgrades=1,
                                    max_unavailable="100%"),
                  node=subjects.CLUSTER, source="test", now=T0),
    ]  # fmt: skip
    steps = [
        (up.UpgradeState.CORDON_REQUIRED, 0),
        (up.UpgradeState.DRAIN_REQUIRED, 4),
        (up.UpgradeState.DRIVER_RELOAD_REQUIRED, 10),
        (up.UpgradeState.UPGRADE_DONE, 40),
    ]
    for index, name in enumerate(["gpu-node-1", "gpu-node-2"]):
        for state, seconds in steps:
            changed = up.NodeUpgradeStateChanged(
                rollout_id=rollout, to_state=state, reason=f"reached {state}", attempt=1,
                components=(Component.GPU,), target_versions=targets,
            )  # fmt: skip
            at = T0 + timedelta(seconds=100 * index + seconds)
            envelopes.append(new_event(changed, node=name, source="test", now=at))
    under_way = up.NodeUpgradeStateChanged(
        rollout_id=rollout, to_state=up.UpgradeState.DRAIN_REQUIRED, reason="cordoned",
        attempt=2, components=(Component.GPU,), target_versions=targets,
    )  # fmt: skip
    envelopes.append(new_event(under_way, node="gpu-node-3", source="test", now=T0))
    await bus.publish_batch(envelopes)
    await bus.close()


async def test_status_reads_the_latest_upgrade_events_with_nats(
    cluster: Cluster, nats_server: NatsServer
) -> None:
    await publish_rollout(nats_server.url)
    code, out, err = await cli("upgrade", "status", "--nats", nats_server.url, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["sources"] == ["events"]
    rows = {n["node"]: n for n in document["nodes"]}
    assert rows["gpu-node-1"]["state"] == "upgrade-done"
    assert (rows["gpu-node-3"]["state"], rows["gpu-node-3"]["attempt"]) == ("drain-required", 2)
    assert document["rollout"]["id"] == "rollout-gpu-580.200.01"
    assert document["policy"]["versions"] == {"gpu": NEW}

    await cluster.label("gpu-node-3", **{STATE_LABEL: "drain-required"})
    code, out, err = await cluster.cli("upgrade", "status", "--nats", nats_server.url, "--json")
    assert code == 0, err
    merged = {n["node"]: n for n in json.loads(out)["nodes"]}
    assert (merged["gpu-node-3"]["attempt"], merged["gpu-node-3"]["reason"]) == (2, "cordoned")
    assert merged["gpu-node-4"]["attempt"] is None


async def test_plan_predicts_the_waves_and_the_makespan(
    cluster: Cluster, nats_server: NatsServer
) -> None:
    await customobjects.patch(
        cluster.kube, RESOURCE, "default",
        {"spec": {"driver": {"gpu": {"version": NEW}},
                  "upgradePolicy": {"maxParallelUpgrades": 2}}},
    )  # fmt: skip
    before = await cluster.policy()
    code, out, err = await cluster.cli("upgrade", "plan", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert [w["nodes"] for w in plan["waves"]] == [
        ["gpu-node-1", "gpu-node-2"],
        ["gpu-node-3", "gpu-node-4"],
        ["gpu-node-5"],
    ]
    assert plan["makespanSeconds"] == pytest.approx(3 * plan["nodeSeconds"], abs=0.5)
    assert all(d["samples"] == 0 for d in plan["durations"].values())
    assert (await cluster.policy())["metadata"]["resourceVersion"] == before["metadata"][
        "resourceVersion"
    ]  # a dry run

    await publish_rollout(nats_server.url)
    code, out, err = await cluster.cli("upgrade", "plan", "--nats", nats_server.url, "--json")
    assert code == 0, err
    measured = json.loads(out)["durations"]
    assert measured["cordon-required"] == {"seconds": 4.0, "samples": 2}
    assert measured["driver-reload-required"] == {"seconds": 30.0, "samples": 2}

    code, _, err = await cluster.cli("upgrade", "plan", "--selector", "pool=a")
    assert code == 2 and "unrecognized arguments: --selector" in err


async def test_plan_prints_the_waves_for_people(cluster: Cluster) -> None:
    code, out, _ = await cluster.cli("upgrade", "start", "--version", NEW, "--max-parallel", "3")
    assert code == 0
    code, out, _ = await cluster.cli("upgrade", "plan")
    assert code == 0
    assert "plan for GPUClusterPolicy default: gpu 580.200.01 on 5 selected GPU nodes" in out
    assert "1     0:00   gpu-node-1, gpu-node-2, gpu-node-3" in out
    assert "predicted makespan" in out and "nothing was changed" in out


async def test_errors_exit_1_or_2_with_a_message(cluster: Cluster, tmp_path: Path) -> None:
    code, _, err = await cluster.cli("upgrade", "start", "--version", "580 1")
    assert code == 2 and "--version '580 1': must be a version" in err
    code, _, err = await cluster.cli("upgrade", "start", "--version", NEW, "--component", "nic")
    assert code == 2 and "--component: invalid choice: 'nic'" in err
    code, _, err = await cluster.cli("upgrade", "start", "--version", NEW, "--selector", "a in b")
    assert code == 2 and "--selector 'a in b'" in err
    code, _, err = await cluster.cli("upgrade", "start", "--version", NEW, "--max-parallel", "-1")
    assert code == 2 and "--max-parallel -1" in err
    code, _, err = await cluster.cli("upgrade", "status", "--policy", "other")
    assert code == 1 and "--policy other: no such GPUClusterPolicy (found: default)" in err
    code, _, err = await cli("upgrade", "status", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 2 and "--kubeconfig" in err and "no such file" in err

    await customobjects.delete(cluster.kube, RESOURCE, "default")
    code, _, err = await cluster.cli("upgrade", "pause")
    assert code == 1 and "no GPUClusterPolicy in the cluster" in err

    unreachable = write_kubeconfig(
        tmp_path / "unreachable", f"http://127.0.0.1:{free_port()}", "token"
    )
    code, _, err = await gpuop("upgrade", "status", "--kubeconfig", str(unreachable))
    assert code == 1
    assert err.startswith("gpuop upgrade status: cannot reach the Kubernetes API server at http")


async def test_no_crd_is_a_clear_failure(tmp_path: Path) -> None:
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        code, _, err = await cli("upgrade", "status", "--kubeconfig", str(kubeconfig))
    assert code == 1 and "the CRD gpuclusterpolicies.gpuop.io is not installed" in err


async def test_a_start_amended_with_another_source_is_aborted_as_one(cluster: Cluster) -> None:
    assert (await cluster.cli("upgrade", "start", "--version", NEW))[0] == 0
    mirror = "https://127.0.0.1:9/gpu"
    assert (await cluster.cli("upgrade", "start", "--version", NEW, "--source", mirror))[0] == 0
    code, _, err = await cluster.cli("upgrade", "abort")
    assert code == 0, err
    assert (await cluster.spec())["driver"]["gpu"] == {
        "version": OLD,
        "source": "/srv/drivers",
        **AUTO,
    }


async def test_status_shows_the_skipped_nodes_and_counts_them(cluster: Cluster) -> None:
    await customobjects.patch(
        cluster.kube,
        RESOURCE,
        "default",
        {"spec": {"driver": {"gpu": {"version": NEW}}, "upgradePolicy": {"cordonedNodes": "skip"}}},
    )
    await cluster.label("gpu-node-1", **{"nvidia.com/gpu-driver-upgrade.skip": "true"})
    await cluster.label("gpu-node-2", **{"nvidia.com/ofed-driver-upgrade.skip": "true"})
    await cluster.kube.call(
        cluster.kube.core.patch_node, "gpu-node-3", {"spec": {"unschedulable": True}}
    )
    status = {"nodes": {"upgrade-required": 5}, "skipped": 2}  # as the orchestrator counts
    await customobjects.patch_status(cluster.kube, RESOURCE, "default", status)

    code, out, err = await cluster.cli("upgrade", "status", "--json")
    assert code == 0, err
    document = json.loads(out)
    skipped = {n["node"]: n["skipped"] for n in document["nodes"]}
    assert skipped == {
        "gpu-node-1": "skipped: nvidia.com/gpu-driver-upgrade.skip=true",
        "gpu-node-2": None,  # the policy leaves OFED alone: its GPU driver is upgraded
        "gpu-node-3": "skipped: cordoned by someone else (cordonedNodes: skip)",
        "gpu-node-4": None,
        "gpu-node-5": None,
    }
    assert document["summary"]["skipped"] == 2
    assert document["policy"]["skipped"] == 2

    code, out, _ = await cluster.cli("upgrade", "status")
    assert code == 0
    assert "5 nodes: 5 upgrade-required; 2 skipped" in out
    (row,) = [line for line in out.splitlines() if line.startswith("gpu-node-1 ")]
    assert "  skipped: nvidia.com/gpu-driver-upgrade.skip=true; runs 580.159.04" in row


# `gpuop remediation release` and the executor's replacement label: the hand-over's label is
# set and removed; the verb sets `done` on a node held for replacement and refuses (exit 1) a
# node that is not held, or does not exist.


async def label(cluster: Cluster) -> str | None:
    return nodes.labels_of(await nodes.get(cluster.kube, "gpu-node-1")).get(REPLACEMENT_LABEL)


async def test_the_hand_over_label_is_set_then_released_then_removed(cluster: Cluster) -> None:
    executor = KubeExecutor(cluster.kube, EventRecorder(cluster.kube))
    refused = await cluster.cli("remediation", "release", "gpu-node-1")
    assert refused[0] == 1 and "not held for hardware replacement" in refused[2]

    await executor.execute("gpu-node-1", MarkReplacement(id="a-1", value="required"))
    assert await label(cluster) == "required"
    code, out, _ = await cluster.cli("remediation", "release", "gpu-node-1", "--json")
    assert code == 0 and '"value": "done"' in out
    assert await label(cluster) == "done"
    again = await cluster.cli("remediation", "release", "gpu-node-1")
    assert again[0] == 1 and f"{REPLACEMENT_LABEL}=done" in again[2]

    await executor.execute("gpu-node-1", MarkReplacement(id="a-2", value=None))
    assert await label(cluster) is None


async def test_a_node_that_does_not_exist_is_a_clear_failure(cluster: Cluster) -> None:
    code, _, err = await cluster.cli("remediation", "release", "gpu-node-9")
    assert code == 1 and "gpu-node-9 not found" in err
