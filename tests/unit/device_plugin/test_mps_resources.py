"""MPS replicas as the plugin plans and allocates them: replica ids as time-slicing's, one
control daemon per resource with upstream's limits, and Allocate's answer carrying the
daemon's pipe, its mounts and the client limits; a request for more than one replica fails
as upstream's does. And what the config in force tells GPU Feature Discovery's labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuop.events.device import SharingStrategy
from gpuop.host.roots import HostRoot
from gpuop.inventory.labeling import LabelSettings, labels_for, with_plugin_config
from gpuop.services.device_plugin import agent, selecting
from gpuop.services.device_plugin.config import DevicePluginConfig, PluginConfigs
from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.mps import MIB, MpsDaemon
from gpuop.services.device_plugin.resources import (
    MAX_SHARED_REQUEST,
    GpuResource,
    gpu_resources,
    mps_daemons,
)
from tests.support.device_plugin import config, sim_inventory
from tests.support.inventories import inventory
from tests.support.mps import mps_document

GPU = "nvidia.com/gpu"


@pytest.fixture
def root(tmp_path: Path) -> HostRoot:
    return HostRoot(tmp_path)


def in_force(document: DevicePluginConfig) -> selecting.Selection:
    """The selection of a node running the single config `document`."""
    return selecting.select(PluginConfigs.single(document), None)


def mps_plan(root: HostRoot, gpus: int = 2, **document: Any) -> tuple[GpuResource, MpsDaemon]:
    plan = gpu_resources(sim_inventory(root, gpus=gpus), config(document or mps_document()))
    (resource,) = plan.resources
    (daemon,) = mps_daemons(plan)
    assert resource.mps is daemon
    return resource, daemon


def test_mps_replicas_are_advertised_as_time_slicing_replicas(root: HostRoot) -> None:
    resource, _ = mps_plan(root)
    first, second = (gpu.whole for gpu in sim_inventory(root, gpus=2).gpus)
    assert resource.name == GPU
    assert [d.id for d in resource.devices] == [
        *(f"{first.uuid}::{n}" for n in range(4)),
        *(f"{second.uuid}::{n}" for n in range(4)),
    ]
    assert {d.gpu_uuid for d in resource.devices[:4]} == {first.uuid}, "health per GPU"


def test_one_daemon_per_resource_with_upstreams_limits(root: HostRoot) -> None:
    _, daemon = mps_plan(root)
    memory = sim_inventory(root, gpus=2).gpus[0].whole.memory_bytes
    share = memory // 4 // MIB
    assert (daemon.resource, daemon.replicas, len(daemon.gpus)) == (GPU, 4, 2)
    assert daemon.pipe_dir == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert daemon.log_dir == "/run/nvidia/mps/nvidia.com/gpu/log"
    assert daemon.thread_percentage == 25
    assert daemon.limit_commands == (
        f"set_default_device_pinned_mem_limit 0 {share}M",
        f"set_default_device_pinned_mem_limit 1 {share}M",
        "set_default_active_thread_percentage 25",
    )
    assert dict(daemon.environment) == {
        "CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir,
    }


def test_the_thread_share_rounds_down_as_upstreams(root: HostRoot) -> None:
    _, daemon = mps_plan(root, **mps_document(3))
    assert daemon.thread_percentage == 33


@pytest.mark.parametrize("listing", ["envvar", "cdi"])
def test_allocating_a_replica_hands_out_the_daemons_pipe_and_limits(
    root: HostRoot, listing: str
) -> None:
    document = {**mps_document(), "flags": {"plugin": {"deviceListStrategy": listing}}}
    resource, _ = mps_plan(root, **document)
    chosen = resource.devices[5]  # a replica of the second GPU
    answer = resource.allocate([chosen.id])
    envs = dict(answer.envs)
    assert envs.pop("NVIDIA_VISIBLE_DEVICES", chosen.target.uuid) == chosen.target.uuid
    assert envs == {
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        # the container sees its one GPU as device 0
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={chosen.target.memory_bytes // 4 // MIB}M",
    }
    assert {(m.container_path, m.host_path, m.read_only) for m in answer.mounts} == {
        ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe", False),
        ("/dev/shm", "/run/nvidia/mps/shm", False),
    }
    assert (listing == "cdi") == bool(answer.cdi_devices)


def test_a_request_for_more_than_one_mps_replica_fails(root: HostRoot) -> None:
    resource, _ = mps_plan(root)
    ids = [resource.devices[0].id, resource.devices[4].id]
    with pytest.raises(AllocationError) as refused:
        resource.allocate(ids)
    assert MAX_SHARED_REQUEST in str(refused.value)
    assert "asked for 2" in str(refused.value)


def test_with_fail_requests_off_two_gpus_get_a_limit_each(root: HostRoot) -> None:
    resource, _ = mps_plan(root, **mps_document(4, failRequestsGreaterThanOne=False))
    first, second = resource.devices[0], resource.devices[4]
    answer = resource.allocate([second.id, first.id])
    share = first.target.memory_bytes // 4 // MIB
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{second.target.uuid},{first.target.uuid}"
    assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={share}M,1={share}M"


def test_a_renamed_mps_resource_has_a_daemon_of_its_own_name(root: HostRoot) -> None:
    resource, daemon = mps_plan(root, **mps_document(2, renameByDefault=True))
    assert resource.name == daemon.resource == "nvidia.com/gpu.shared"
    assert daemon.pipe_dir == "/run/nvidia/mps/nvidia.com/gpu.shared/pipe"
    answer = resource.allocate([resource.devices[0].id])
    assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu.shared/pipe"


def test_time_slicing_and_no_sharing_need_no_daemon_and_hand_out_no_mps(
    root: HostRoot,
) -> None:
    inventory_ = sim_inventory(root, gpus=2)
    sliced = {"sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}}}
    for document in ({}, sliced):
        plan = gpu_resources(inventory_, config(document))
        assert mps_daemons(plan) == ()
        (resource,) = plan.resources
        answer = resource.allocate([resource.devices[0].id])
        assert set(answer.envs) == {"NVIDIA_VISIBLE_DEVICES"}
        assert not answer.mounts


def test_under_the_mixed_strategy_mps_shares_the_gpus_without_mig(root: HostRoot) -> None:
    document = {**mps_document(2), "flags": {"migStrategy": "mixed"}}
    inventory_ = sim_inventory(root, gpus=2, mig={0: ["3g.71gb", "3g.71gb"]})
    plan = gpu_resources(inventory_, config(document))
    (daemon,) = mps_daemons(plan)
    assert [gpu.uuid for gpu in daemon.gpus] == [inventory_.gpus[1].whole.uuid]
    mig = next(r for r in plan.resources if r.name == "nvidia.com/mig-3g.71gb")
    assert mig.mps is None and mig.replicas == 1


def test_the_config_in_force_reports_mps_sharing() -> None:
    shared = selecting.sharing(config(mps_document(4)))
    assert shared == selecting.Sharing(4, SharingStrategy.MPS)
    renamed = selecting.sharing(config(mps_document(2, renameByDefault=True)))
    assert renamed == selecting.Sharing(2, SharingStrategy.MPS, renamed=True)
    report = agent.applied(in_force(config(mps_document(4))))
    assert (report.replicas, report.sharing_strategy, report.renamed) == (4, "mps", False)


@pytest.mark.parametrize(
    ("strategy", "renamed", "expected"),
    [
        (SharingStrategy.MPS, False, ("4", "mps", "true", "NVIDIA-H200-SHARED")),
        (SharingStrategy.MPS, True, ("4", "mps", "true", "NVIDIA-H200")),
        (SharingStrategy.TIME_SLICING, False, ("4", "time-slicing", "false", "NVIDIA-H200-SHARED")),
        (SharingStrategy.NONE, False, ("1", "none", "false", "NVIDIA-H200")),
    ],
)
def test_mps_sharing_labels_the_node_mps_capable(
    strategy: SharingStrategy, renamed: bool, expected: tuple[str, ...]
) -> None:
    report = agent.applied(
        in_force(
            config(mps_document(4, renameByDefault=renamed))
            if strategy is SharingStrategy.MPS
            else config(
                {"sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}}}
                if strategy is SharingStrategy.TIME_SLICING
                else {}
            )
        )
    )
    labels = labels_for(inventory(), with_plugin_config(LabelSettings(), report))
    keys = ("gpu.replicas", "gpu.sharing-strategy", "mps.capable", "gpu.product")
    assert tuple(labels[f"nvidia.com/{key}"] for key in keys) == expected
