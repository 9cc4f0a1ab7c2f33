"""The DRA plugin's prepare and unprepare, without gRPC: claims from the bus's facts, the
CDI spec per claim, the checkpoint across restarts, per-claim errors."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from gpuop.clocks import VirtualClock
from gpuop.host.roots import HostRoot
from gpuop.inventory.claims import ClaimHolders
from gpuop.services.device_plugin.dra import cdispecs, checkpoint
from gpuop.services.device_plugin.dra.checkpoint import Checkpoint, PreparedClaim, State
from gpuop.services.device_plugin.dra.preparing import (
    NOT_YET_KNOWN,
    SWEEP_AFTER,
    ClaimName,
    PrepareError,
    Preparer,
)
from gpuop.services.device_plugin.inventory import GpuInventory
from tests.support.device_plugin import sim_inventory
from tests.support.dra_kubelet import allocated, claim_uid, released

NODE = "node-a"
BOOT = "0f9e3c55-6a0e-4a8e-9d55-000000000001"


def name(n: int) -> ClaimName:
    return ClaimName("ml", f"claim-{n}", claim_uid(n))


@pytest.fixture
def root(tmp_path: Path) -> HostRoot:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    return HostRoot(tmp_path)


@pytest.fixture
def inventory(root: HostRoot) -> GpuInventory:
    return sim_inventory(root, gpus=2, mig={1: ["3g.71gb"]})


def preparer(
    root: HostRoot,
    inventory: GpuInventory,
    index: ClaimHolders | None = None,
    clock: VirtualClock | None = None,
) -> Preparer:
    path = root.join("var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json")
    loaded = Checkpoint.load(path, BOOT)
    return Preparer(
        root, index or ClaimHolders(), loaded, lambda: inventory, clock or VirtualClock()
    )


def gpu(inventory: GpuInventory, i: int) -> str:
    return inventory.gpus[i].whole.uuid


def test_prepare_writes_the_claims_spec_and_answers_its_cdi_ids(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    plugin.index.apply(allocated(1, [gpu(inventory, 1)], node=NODE, devices=["gpu-1"]))
    answer = plugin.prepare(name(1))
    assert not isinstance(answer, PrepareError)
    [device] = answer
    uid = claim_uid(1)
    assert device.cdi_device_ids == (f"k8s.gpu.nvidia.com/claim={uid}-gpu-1",)
    assert (device.pool_name, device.device_name, device.request_names) == (NODE, "gpu-1", ("gpu",))
    path = root.join(f"var/run/cdi/k8s.gpu.nvidia.com-claim_{uid}.yaml")
    spec = json.loads(path.read_text())
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["devices"] == [
        {"name": f"{uid}-gpu-1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}
    ]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidiactl"}]
    assert plugin.checkpoint.get(uid) is not None
    assert plugin.checkpoint.get(uid).state is State.COMPLETED  # type: ignore[union-attr]


def test_a_mig_device_gets_its_parents_nodes(root: HostRoot, inventory: GpuInventory) -> None:
    plugin = preparer(root, inventory)
    mig = inventory.gpus[1].mig_devices[0]
    plugin.index.apply(
        allocated(
            1,
            [gpu(inventory, 1)],
            node=NODE,
            devices=["gpu-1-mig-3g71gb-9-0"],
            mig_uuids=[mig.uuid],
        )
    )
    assert not isinstance(plugin.prepare(name(1)), PrepareError)
    spec = json.loads(cdispecs.spec_path(root, claim_uid(1)).read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0] == {"path": "/dev/nvidia1"}


def test_the_spec_has_what_the_nodes_nvidia_com_gpu_spec_gives_the_gpu(
    root: HostRoot, inventory: GpuInventory
) -> None:
    from gpuop.host import cdi as host_cdi

    plugin = preparer(root, inventory)
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    assert not isinstance(plugin.prepare(name(1)), PrepareError)
    claim_spec = json.loads(cdispecs.spec_path(root, claim_uid(1)).read_text())
    node_spec = host_cdi.spec(
        [host_cdi.Device((gpu(inventory, 0),), inventory.gpus[0].whole.device_nodes)],
        host_cdi.DriverFiles("", ()),
        host_cdi.control_nodes(root),
        root=root,
    )
    assert claim_spec["containerEdits"] == node_spec["containerEdits"]
    assert claim_spec["devices"][0]["containerEdits"] == node_spec["devices"][0]["containerEdits"]


def test_prepare_twice_answers_the_same_without_writing_again(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    first = plugin.prepare(name(1))
    path = cdispecs.spec_path(root, claim_uid(1))
    path.write_text("kept\n")  # a second prepare must not rewrite it
    assert plugin.prepare(name(1)) == first
    assert path.read_text() == "kept\n"


def test_an_unknown_claim_is_an_error_of_that_claim_only(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    unknown = plugin.prepare(name(2))
    assert isinstance(unknown, PrepareError)
    assert str(unknown).startswith(NOT_YET_KNOWN)
    assert not cdispecs.spec_path(root, claim_uid(2)).exists()
    assert plugin.checkpoint.get(claim_uid(2)) is None
    assert not isinstance(plugin.prepare(name(1)), PrepareError)


def test_a_restart_finds_the_prepared_claim_and_unprepares_it(
    root: HostRoot, inventory: GpuInventory
) -> None:
    first = preparer(root, inventory)
    first.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    answer = first.prepare(name(1))
    again = preparer(root, inventory)  # a new process: the index is empty
    assert again.prepare(name(1)) == answer, "answered from the checkpoint"
    assert again.unprepare(claim_uid(1)) == ""
    assert not cdispecs.spec_path(root, claim_uid(1)).exists()
    assert preparer(root, inventory).checkpoint.get(claim_uid(1)) is None


def test_a_half_prepared_claim_is_rolled_back_then_prepared(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    plugin.checkpoint.put(claim_uid(1), PreparedClaim(State.STARTED, "ml", "claim-1"))
    cdispecs.spec_path(root, claim_uid(1)).parent.mkdir(parents=True)
    cdispecs.spec_path(root, claim_uid(1)).write_text("half\n")
    again = preparer(root, inventory)
    again.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    assert not isinstance(again.prepare(name(1)), PrepareError)
    assert json.loads(cdispecs.spec_path(root, claim_uid(1)).read_text())["kind"]
    assert again.checkpoint.get(claim_uid(1)).state is State.COMPLETED  # type: ignore[union-attr]


def test_a_half_prepared_claim_whose_allocation_is_unknown_is_rolled_back(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    plugin.checkpoint.put(claim_uid(1), PreparedClaim(State.STARTED, "ml", "claim-1"))
    assert isinstance(preparer(root, inventory).prepare(name(1)), PrepareError)
    assert preparer(root, inventory).checkpoint.get(claim_uid(1)) is None


def test_unprepare_of_an_unknown_claim_succeeds(root: HostRoot, inventory: GpuInventory) -> None:
    assert preparer(root, inventory).unprepare(claim_uid(9)) == ""


def test_another_boots_checkpoint_is_discarded(root: HostRoot, inventory: GpuInventory) -> None:
    plugin = preparer(root, inventory)
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    plugin.prepare(name(1))
    rebooted = Checkpoint.load(plugin.checkpoint.path, "another-boot")
    assert rebooted.claims() == {}


def test_an_unreadable_checkpoint_is_an_error_not_an_empty_one(root: HostRoot) -> None:
    path = root.join("checkpoint.json")
    path.write_text("{not json")
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint\.json"):
        Checkpoint.load(path, BOOT)


def test_a_gpu_the_node_does_not_have_is_the_claims_error(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    missing = "GPU-00000000-0000-0000-0000-00000000dead"
    plugin.index.apply(allocated(1, [missing], node=NODE))
    answer = plugin.prepare(name(1))
    assert isinstance(answer, PrepareError)
    assert missing in str(answer)
    assert plugin.checkpoint.get(claim_uid(1)) is None


def test_a_device_prepared_for_another_claim_is_refused(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    plugin.index.apply(allocated(2, [gpu(inventory, 0)], node=NODE))
    assert not isinstance(plugin.prepare(name(1)), PrepareError)
    answer = plugin.prepare(name(2))
    assert isinstance(answer, PrepareError)
    assert "prepared for claim ml/claim-1" in str(answer)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "colour": "red"},
            "colour: Extra inputs are not permitted",
        ),
        (
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS"},
            },
            "sharing.strategy MPS is not supported",
        ),
        (
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "Spatial"},
            },
            "sharing.strategy: Input should be 'TimeSlicing' or 'MPS'",
        ),
        (
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            },
            "interval Long cannot be applied",
        ),
        ({"apiVersion": "v2", "kind": "GpuConfig"}, "apiVersion: Input should be"),
    ],
)
def test_a_config_it_cannot_apply_is_the_claims_error_saying_what(
    root: HostRoot, inventory: GpuInventory, parameters: dict[str, object], expected: str
) -> None:
    plugin = preparer(root, inventory)
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE, configs=[parameters]))
    answer = plugin.prepare(name(1))
    assert isinstance(answer, PrepareError)
    assert expected in str(answer)
    assert not cdispecs.spec_path(root, claim_uid(1)).exists()


def test_time_slicing_with_the_default_interval_is_applied_and_kept(
    root: HostRoot, inventory: GpuInventory
) -> None:
    plugin = preparer(root, inventory)
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
    config = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE, configs=[config]))
    assert not isinstance(plugin.prepare(name(1)), PrepareError)
    assert plugin.checkpoint.get(claim_uid(1)).sharing == {"gpu": "TimeSlicing"}  # type: ignore[union-attr]


def test_the_newest_allocation_wins_and_a_release_is_not_undone_by_an_old_one() -> None:
    index = ClaimHolders()
    gpus = ["GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002"]
    assert index.apply(allocated(1, gpus[:1], node=NODE, version=20))
    assert not index.apply(allocated(1, gpus[1:], node=NODE, version=19))
    assert index.get(claim_uid(1)).devices[0].gpu_uuid == gpus[0]  # type: ignore[union-attr]
    assert index.apply(released(1))
    assert not index.apply(allocated(1, gpus[:1], node=NODE, version=20)), "a late redelivery"
    assert index.get(claim_uid(1)) is None
    assert index.apply(allocated(1, gpus[1:], node=NODE, version=30)), "allocated again"
    assert not index.apply(released(2))


def half_prepared(plugin: Preparer, n: int, started_at: datetime | None) -> Path:
    """Claim `n` as a plugin that died mid-prepare left it: `PrepareStarted`, its spec
    written; the spec's path."""
    entry = PreparedClaim(State.STARTED, "ml", f"claim-{n}", started_at=started_at)
    plugin.checkpoint.put(claim_uid(n), entry)
    spec = cdispecs.spec_path(plugin.root, claim_uid(n))
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text("half\n")
    return spec


def test_a_half_prepared_claim_no_longer_allocated_is_swept_after_ten_minutes(
    root: HostRoot, inventory: GpuInventory
) -> None:
    clock = VirtualClock()
    plugin = preparer(root, inventory, clock=clock)
    plugin.index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    plugin.index.apply(released(1))
    plugin.index.ready.set()
    spec = half_prepared(plugin, 1, clock.now())
    clock.advance(SWEEP_AFTER.total_seconds() - 1)
    assert plugin.sweep() == (), "a prepare younger than ten minutes may be in flight"
    assert spec.exists()
    clock.advance(1)
    assert plugin.sweep() == (claim_uid(1),)
    assert not spec.exists()
    assert preparer(root, inventory).checkpoint.get(claim_uid(1)) is None, "written through"


def test_the_sweep_leaves_allocated_completed_and_not_yet_read_claims(
    root: HostRoot, inventory: GpuInventory
) -> None:
    clock = VirtualClock()
    index = ClaimHolders()
    plugin = preparer(root, inventory, index, clock=clock)
    index.apply(allocated(1, [gpu(inventory, 0)], node=NODE))
    index.apply(allocated(2, [gpu(inventory, 1)], node=NODE, devices=["gpu-1"]))
    assert not isinstance(plugin.prepare(name(2)), PrepareError)
    index.apply(released(2))
    allocated_spec = half_prepared(plugin, 1, clock.now())  # the kubelet will ask again
    unknown_spec = half_prepared(plugin, 3, None)  # from a checkpoint without times
    clock.advance(3600)
    assert plugin.sweep() == (), "not before every claim fact of the log was read"
    index.ready.set()
    assert plugin.sweep() == (claim_uid(3),)
    assert allocated_spec.exists() and not unknown_spec.exists()
    assert plugin.checkpoint.get(claim_uid(2)).state is State.COMPLETED  # type: ignore[union-attr]
    assert cdispecs.spec_path(root, claim_uid(2)).exists(), "unprepare is the kubelet's"


def test_a_sweep_that_cannot_remove_the_spec_keeps_the_entry_for_the_next(
    root: HostRoot, inventory: GpuInventory
) -> None:
    clock = VirtualClock()
    plugin = preparer(root, inventory, clock=clock)
    plugin.index.ready.set()
    spec = half_prepared(plugin, 1, clock.now())
    spec.unlink()
    spec.mkdir()  # a directory where the spec was: its removal fails
    (spec / "inside").touch()
    clock.advance(SWEEP_AFTER.total_seconds())
    assert plugin.sweep() == ()
    assert plugin.checkpoint.get(claim_uid(1)) is not None
