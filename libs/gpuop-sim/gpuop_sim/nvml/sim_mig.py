"""MIG on a simulated H200: its profiles, placement rules, and the instances carved out of it.

An H200 splits into 7 compute slices and 8 memory slices. The profiles, their NVML ids and
engine counts follow NVIDIA's MIG user guide for Hopper (H100 and H200 share the layout; the
H200's memory names them `1g.18gb` ... `7g.141gb`); memory per instance is one eighth of the
recorded framebuffer per memory slice, rounded down to 256 MiB.

Placement follows `nvidia-smi mig -lgipp` on Hopper: an instance of `m` memory slices starts
at a multiple of `m` (a one-slice instance at 0 to 6, the last slice going to no small
instance), `4g` only at 0, `7g` takes all eight. An instance that overlaps another fails
with `InsufficientResources`, as NVML does; so does one more than its profile's count. GPU
instance ids are the slot's node in NVML's binary split of the memory (0 for the whole GPU,
1-2 for halves, 3-6 for quarters, 7-14 for eighths), so a layout put back at the same
placements has the same ids and MIG device UUIDs. Each GPU instance holds at most one
compute instance, the whole of it (id 0), which is all gpuop creates.

Instances live as long as the driver that made them, as on a real GPU: the MIG mode persists
across a driver reload and a reboot, GPU and compute instances do not (NVIDIA's mig-manager
applies its config again after every boot for that reason). `SimMig.epoch` is the driver load
and GPU reset the instances were made under (`SimNvml` keeps them from the host's reset
counts, `gpuop_sim.host.simreset`); `expire` clears the instances of an older epoch and
keeps the mode, a pending one taking effect.

`SimMig` is one GPU's MIG state; `SimNvml` keeps one per GPU and serves `MigControl` with it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuop.nvml.devices import MIB
from gpuop.nvml.errors import InsufficientResources, InUse, InvalidArgument, NotFound
from gpuop.nvml.mig import GpuInstance, MigDevice, MigModeState, MigProfile, Placement, fit

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class _Shape:
    name: str
    profile_id: int
    slices: int
    memory_slices: int
    instances: int
    multiprocessors: int
    copy: int
    decoders: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]

    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(start, self.memory_slices) for start in self.starts)


_H200 = (
    _Shape("1g.18gb", 19, 1, 1, 7, 16, 1, 1, 1, 0, (0, 1, 2, 3, 4, 5, 6)),
    _Shape("1g.18gb+me", 20, 1, 1, 1, 16, 1, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    _Shape("1g.35gb", 15, 1, 2, 4, 16, 1, 1, 1, 0, (0, 2, 4, 6)),
    _Shape("2g.35gb", 14, 2, 2, 3, 32, 2, 2, 2, 0, (0, 2, 4)),
    _Shape("3g.71gb", 9, 3, 4, 2, 60, 3, 3, 3, 0, (0, 4)),
    _Shape("4g.71gb", 5, 4, 4, 1, 64, 4, 4, 4, 0, (0,)),
    _Shape("7g.141gb", 0, 7, 8, 1, 132, 8, 7, 7, 1, (0,)),
)
H200_PROFILE_NAMES = tuple(shape.name for shape in _H200)
"""Every GPU instance profile a simulated H200 offers."""
_BY_ID = {shape.profile_id: shape for shape in _H200}
_BY_NAME = {shape.name: shape for shape in _H200}


def h200_profiles(memory_total_bytes: int) -> tuple[MigProfile, ...]:
    """The H200's GPU instance profiles for a GPU with this much framebuffer."""
    slice_bytes = _slice_bytes(memory_total_bytes)
    return tuple(
        MigProfile(
            name=shape.name,
            profile_id=shape.profile_id,
            slice_count=shape.slices,
            instance_count=shape.instances,
            memory_bytes=shape.memory_slices * slice_bytes,
            multiprocessor_count=shape.multiprocessors,
            copy_engines=shape.copy,
            decoders=shape.decoders,
            encoders=0,
            jpeg_engines=shape.jpeg,
            ofa_engines=shape.ofa,
            placements=shape.placements(),
        )
        for shape in _H200
    )


def gpu_instance_id(placement: Placement) -> int:
    """NVML's GPU instance id for an instance at `placement`."""
    first_of_level = MEMORY_SLICES // placement.size - 1
    return first_of_level + placement.start // placement.size


@dataclass
class _Instance:
    shape: _Shape
    placement: Placement
    compute: bool = False


@dataclass
class SimMig:
    """One simulated GPU's MIG mode and instances."""

    mode: MigModeState = field(default_factory=lambda: MigModeState(False, False))
    instances: dict[int, _Instance] = field(default_factory=dict)
    reset_required: bool = False
    """A mode change stays pending until `reset()`, as on a GPU that needs a reset for it."""
    epoch: tuple[int, int] | None = None
    """The driver loads and this GPU's resets counted when the instances were made; None
    until a session that knows the counts adopts the state (one carved without a kernel)."""

    def set_mode(self, enabled: bool, busy: bool) -> MigModeState:
        if busy:
            raise InUse("nvmlDeviceSetMigMode: processes are running on the GPU")
        if self.instances:
            raise InUse("nvmlDeviceSetMigMode: GPU instances exist; destroy them first")
        current = self.mode.current if self.reset_required else enabled
        self.mode = MigModeState(current=current, pending=enabled)
        return self.mode

    def to_json(self) -> dict[str, object]:
        """The state as JSON, for `SimNvml`'s file shared by a node's services."""
        return {
            "mode": [self.mode.current, self.mode.pending],
            "reset_required": self.reset_required,
            "epoch": None if self.epoch is None else list(self.epoch),
            "instances": [
                [gi_id, i.shape.profile_id, i.placement.start, i.placement.size, i.compute]
                for gi_id, i in sorted(self.instances.items())
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SimMig:
        current, pending = data["mode"]
        instances = {
            int(gi_id): _Instance(_BY_ID[int(profile_id)], Placement(start, size), bool(compute))
            for gi_id, profile_id, start, size, compute in data["instances"]
        }
        epoch = data.get("epoch")  # absent in a file written before epochs
        return cls(
            MigModeState(bool(current), bool(pending)),
            instances,
            data["reset_required"],
            None if epoch is None else (int(epoch[0]), int(epoch[1])),
        )

    def expire(self, epoch: tuple[int, int]) -> bool:
        """Catch up with the driver loads and resets counted now (`epoch`): after another
        load or reset the instances are gone and a pending mode is current; a state of no
        epoch adopts this one. Whether anything changed."""
        if self.epoch == epoch:
            return False
        if self.epoch is not None:
            self.reset()
        self.epoch = epoch
        return True

    def reset(self) -> None:
        """A GPU reset: a pending mode takes effect, every instance is gone."""
        self.instances.clear()
        self.mode = MigModeState(self.mode.pending, self.mode.pending)

    def create_gpu_instance(self, profile_id: int, placement: Placement) -> int:
        self._require_mig()
        shape = _BY_ID.get(profile_id)
        if shape is None:
            raise InvalidArgument(f"nvmlDeviceCreateGpuInstance: no profile id {profile_id}")
        if placement not in shape.placements():
            raise InvalidArgument(
                f"nvmlDeviceCreateGpuInstanceWithPlacement: {shape.name} cannot start at "
                f"slice {placement.start} with size {placement.size}"
            )
        same = sum(1 for i in self.instances.values() if i.shape is shape)
        if same >= shape.instances:
            raise InsufficientResources(f"at most {shape.instances} of {shape.name} fit a GPU")
        if any(placement.overlaps(i.placement) for i in self.instances.values()):
            raise InsufficientResources(
                f"{shape.name} at slice {placement.start}: overlaps an existing GPU instance"
            )
        used = sum(i.shape.slices for i in self.instances.values())
        if used + shape.slices > COMPUTE_SLICES:
            raise InsufficientResources(f"{shape.name}: not enough compute slices left")
        gi_id = gpu_instance_id(placement)
        self.instances[gi_id] = _Instance(shape, placement)
        return gi_id

    def destroy_gpu_instance(self, gi_id: int) -> None:
        instance = self._instance(gi_id)
        if instance.compute:
            raise InUse(f"nvmlGpuInstanceDestroy: GPU instance {gi_id} has a compute instance")
        del self.instances[gi_id]

    def create_compute_instance(self, gi_id: int) -> int:
        instance = self._instance(gi_id)
        if instance.compute:
            raise InsufficientResources(f"GPU instance {gi_id} has its compute instance already")
        instance.compute = True
        return 0

    def destroy_compute_instance(self, gi_id: int, ci_id: int) -> None:
        instance = self._instance(gi_id)
        if ci_id != 0 or not instance.compute:
            raise NotFound(f"no compute instance {ci_id} in GPU instance {gi_id}")
        instance.compute = False

    def gpu_instances(self) -> tuple[GpuInstance, ...]:
        return tuple(
            GpuInstance(
                gpu_instance_id=gi_id,
                profile_id=instance.shape.profile_id,
                placement=instance.placement,
                compute_instance_ids=(0,) if instance.compute else (),
            )
            for gi_id, instance in sorted(self.instances.items())
        )

    def devices(
        self, parent_index: int, parent_uuid: str, memory_total_bytes: int
    ) -> tuple[MigDevice, ...]:
        """The MIG devices: one per GPU instance with its compute instance, by GI id."""
        if not self.mode.current:
            return ()
        slice_bytes = _slice_bytes(memory_total_bytes)
        ready = [(gi, i) for gi, i in sorted(self.instances.items()) if i.compute]
        return tuple(
            _device(parent_index, parent_uuid, position, gi_id, i, slice_bytes)
            for position, (gi_id, i) in enumerate(ready)
        )

    def _require_mig(self) -> None:
        if not self.mode.current:
            raise InvalidArgument("nvmlDeviceCreateGpuInstance: MIG mode is off")

    def _instance(self, gi_id: int) -> _Instance:
        instance = self.instances.get(gi_id)
        if instance is None:
            raise NotFound(f"no GPU instance {gi_id}")
        return instance


def check_layout(profiles: Sequence[str]) -> None:
    """`ValueError` when the profiles are not H200 ones or cannot all fit one GPU."""
    unknown = sorted(set(profiles) - _BY_NAME.keys())
    if unknown:
        raise ValueError(f"not an H200 MIG profile: {', '.join(unknown)}")
    chosen = [_BY_NAME[name] for name in profiles]
    for name, count in Counter(profiles).items():
        if count > _BY_NAME[name].instances:
            raise ValueError(f"at most {_BY_NAME[name].instances} instances of {name} fit a GPU")
    if sum(s.slices for s in chosen) > COMPUTE_SLICES:
        raise ValueError(f"{', '.join(profiles)} need more than {COMPUTE_SLICES} compute slices")
    if sum(s.memory_slices for s in chosen) > MEMORY_SLICES:
        raise ValueError(f"{', '.join(profiles)} need more than {MEMORY_SLICES} memory slices")


def carve(state: SimMig, memory_total_bytes: int, profiles: Sequence[str]) -> None:
    """Put MIG on with one full instance per profile, wherever they fit (`enable_mig`)."""
    check_layout(profiles)
    by_name = {p.name: p for p in h200_profiles(memory_total_bytes)}
    placements = fit([by_name[name] for name in profiles])
    if placements is None:
        raise ValueError(f"{', '.join(profiles)}: no placement fits them all on one GPU")
    state.instances.clear()
    state.mode = MigModeState(True, True)
    for name, placement in zip(profiles, placements, strict=True):
        gi_id = state.create_gpu_instance(_BY_NAME[name].profile_id, placement)
        state.create_compute_instance(gi_id)


def mig_uuid(parent_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """A MIG device UUID in the driver's format, `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`,
    stable for a parent GPU and instance ids."""
    digest = hashlib.sha256(
        f"{parent_uuid}/{gpu_instance_id}/{compute_instance_id}".encode()
    ).hexdigest()
    return f"MIG-{_uuid_body(digest)}"


def _device(
    parent_index: int,
    parent_uuid: str,
    position: int,
    gi_id: int,
    instance: _Instance,
    slice_bytes: int,
) -> MigDevice:
    shape = instance.shape
    return MigDevice(
        parent_index=parent_index,
        parent_uuid=parent_uuid,
        index=position,
        uuid=mig_uuid(parent_uuid, gi_id, 0),
        profile=shape.name,
        gpu_instance_id=gi_id,
        compute_instance_id=0,
        gpu_instance_profile_id=shape.profile_id,
        gpu_instance_slices=shape.slices,
        compute_instance_slices=shape.slices,
        memory_total_bytes=shape.memory_slices * slice_bytes,
        multiprocessor_count=shape.multiprocessors,
        copy_engines=shape.copy,
        decoders=shape.decoders,
        encoders=0,
        jpeg_engines=shape.jpeg,
        ofa_engines=shape.ofa,
        placement=instance.placement,
    )


def _uuid_body(digest: str) -> str:
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _slice_bytes(memory_total_bytes: int) -> int:
    return (memory_total_bytes // MEMORY_SLICES) // (256 * MIB) * (256 * MIB)
