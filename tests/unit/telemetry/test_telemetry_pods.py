"""Pod attribution: every form of device id the device plugin may advertise maps back to its
GPU; other resources and strangers are ignored."""

from __future__ import annotations

from gpuop.nvml import inventory
from gpuop.services.telemetry.pods import DeviceAssignment, Owner, attribute, device_ids
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.node_agents import NODE

A = Owner("ml", "trainer-0", "main")
B = Owner("ml", "notebook", "lab")
GPU = "nvidia.com/gpu"


def node_ids() -> tuple[dict[str, int], list[str]]:
    sim = SimNvml(4, node=NODE)
    sim.init()
    sim.enable_mig(3, ["3g.71gb", "4g.71gb"])
    gpus = inventory(sim)
    migs = sim.mig_devices(3)
    return device_ids(gpus, migs), [gpu.uuid for gpu in gpus] + [mig.uuid for mig in migs]


def test_uuids_indices_and_device_names_all_map_to_their_gpu() -> None:
    ids, uuids = node_ids()
    assignments = [
        DeviceAssignment(GPU, uuids[0], A),
        DeviceAssignment(GPU, "1", B),
        DeviceAssignment(GPU, "nvidia2", B),
    ]

    assert attribute(assignments, ids, [GPU]) == {0: (A,), 1: (B,), 2: (B,)}


def test_time_sliced_replicas_map_back_to_their_gpu_and_sharers_are_all_listed() -> None:
    ids, uuids = node_ids()
    assignments = [
        DeviceAssignment(GPU, f"{uuids[0]}::0", A),
        DeviceAssignment(GPU, f"{uuids[0]}::1", A),
        DeviceAssignment(GPU, f"{uuids[0]}::2", B),
    ]

    assert attribute(assignments, ids, [GPU]) == {0: (B, A)}


def test_mig_devices_are_attributed_to_their_parent_gpu() -> None:
    ids, uuids = node_ids()
    mig = uuids[4]

    assert attribute([DeviceAssignment("nvidia.com/mig-3g.71gb", mig, A)], ids, [GPU]) == {3: (A,)}


def test_other_resources_and_unknown_ids_are_ignored() -> None:
    ids, uuids = node_ids()
    assignments = [
        DeviceAssignment("rdma/rdma_shared_device_a", uuids[0], A),
        DeviceAssignment(GPU, "GPU-00000000-0000-0000-0000-000000000000", A),
        DeviceAssignment(GPU, "7", A),
    ]

    assert attribute(assignments, ids, [GPU]) == {}


def test_extra_resource_names_count_as_gpus() -> None:
    ids, uuids = node_ids()
    shared = DeviceAssignment("nvidia.com/gpu.shared", uuids[1], A)

    assert attribute([shared], ids, [GPU]) == {}
    assert attribute([shared], ids, [GPU, "nvidia.com/gpu.shared"]) == {1: (A,)}
