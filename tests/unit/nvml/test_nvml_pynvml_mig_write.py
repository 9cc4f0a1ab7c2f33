"""The real backend's MIG write path, down to the C calls: nvidia-ml-py's own wrappers run,
and a fake libnvidia-ml answers each function with the argument types nvml.h declares
(pointers where it takes pointers, by value where it takes values), so the structures and
arrays `real_mig` hands pynvml reach the library as the header says they must."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from gpuop.nvml import errors, real_mig
from gpuop.nvml.binding import Binding
from gpuop.nvml.mig import Placement

DEVICE = ctypes.c_void_p(0xD0)
GI_BASE = 0x1000
CI_BASE = 0x2000
PROFILES = {  # profile index -> (id, slices, instances, name)
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 7, b"MIG 1g.18gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 2, b"MIG 3g.71gb"),
}


def out(arg: Any, kind: type) -> Any:
    """The object an output pointer (`byref(x)`) points at, checked to be of `kind`."""
    assert type(arg).__name__ == "CArgObject", f"expected a pointer, got {arg!r}"
    assert isinstance(arg._obj, kind), f"expected a {kind.__name__} *, got {arg._obj!r}"
    return arg._obj


def set_handle(arg: Any, kind: type, value: int) -> None:
    """Write an opaque handle (a pointer) through an output pointer."""
    target = out(arg, kind)
    ctypes.cast(ctypes.byref(target), ctypes.POINTER(ctypes.c_void_p))[0] = value


def handle_value(handle: Any) -> int:
    value = ctypes.cast(handle, ctypes.c_void_p).value
    assert value is not None
    return value


class FakeLibrary:
    """libnvidia-ml's MIG functions over one GPU: GPU instances and their compute instances."""

    def __init__(self) -> None:
        self.mode = [0, 0]
        self.instances: dict[int, tuple[int, int, int]] = {}  # gi id -> profile id, start, size
        self.computes: dict[int, set[int]] = {}
        self.calls: list[str] = []
        self.refuse: dict[str, int] = {}

    def function(self, name: str) -> Callable[..., int]:
        implementation = getattr(self, name)

        def call(*args: Any) -> int:
            self.calls.append(name)
            if name in self.refuse:
                return self.refuse[name]
            assert args[0] is DEVICE or name.startswith(("nvmlGpuInstance", "nvmlCompute"))
            return int(implementation(*args))

        return call

    def nvmlDeviceSetMigMode(self, device: Any, mode: int, status: Any) -> int:
        assert mode in (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE)
        out(status, ctypes.c_uint).value = pynvml.NVML_SUCCESS
        self.mode = [mode, mode]
        return 0

    def nvmlDeviceGetMigMode(self, device: Any, current: Any, pending: Any) -> int:
        out(current, ctypes.c_uint).value, out(pending, ctypes.c_uint).value = self.mode
        return 0

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, device: Any, profile: int, info: Any) -> int:
        if profile not in PROFILES:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        filled = out(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
        assert filled.version == pynvml.nvmlGpuInstanceProfileInfo_v2
        filled.id, filled.sliceCount, filled.instanceCount, filled.name = PROFILES[profile]
        return 0

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, device: Any, profile_id: int, placements: Any, count: Any
    ) -> int:
        assert isinstance(placements, ctypes.Array)
        assert placements._type_ is pynvml.c_nvmlGpuInstancePlacement_t
        room = out(count, ctypes.c_uint)
        assert room.value == len(placements)  # in: the array's size
        starts = {19: range(7), 9: (0, 4)}[profile_id]
        size = 1 if profile_id == 19 else 4
        for i, start in enumerate(starts):
            placements[i].start, placements[i].size = start, size
        room.value = len(starts)  # out: how many were written
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profile_id: int, placement: Any, instance: Any
    ) -> int:
        where = out(placement, pynvml.c_nvmlGpuInstancePlacement_t)
        gi_id = {1: 7, 4: 1}[where.size] + where.start // where.size
        if gi_id in self.instances:
            return int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        self.instances[gi_id] = (profile_id, where.start, where.size)
        set_handle(instance, pynvml.c_nvmlGpuInstance_t, GI_BASE + gi_id)
        return 0

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gi_id: int, instance: Any) -> int:
        if gi_id not in self.instances:
            return int(pynvml.NVML_ERROR_NOT_FOUND)
        set_handle(instance, pynvml.c_nvmlGpuInstance_t, GI_BASE + gi_id)
        return 0

    def nvmlGpuInstanceGetInfo(self, instance: Any, info: Any) -> int:
        gi_id = handle_value(instance) - GI_BASE
        filled = out(info, pynvml.c_nvmlGpuInstanceInfo_t)
        profile_id, start, size = self.instances[gi_id]
        filled.id, filled.profileId = gi_id, profile_id
        filled.placement.start, filled.placement.size = start, size
        return 0

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profile_id: int, instances: Any, count: Any
    ) -> int:
        assert isinstance(instances, ctypes.Array)
        assert instances._type_ is pynvml.c_nvmlGpuInstance_t
        found = [gi for gi, (pid, *_) in sorted(self.instances.items()) if pid == profile_id]
        for i, gi_id in enumerate(found):
            ctypes.cast(instances, ctypes.POINTER(ctypes.c_void_p))[i] = GI_BASE + gi_id
        out(count, ctypes.c_uint).value = len(found)
        return 0

    def nvmlGpuInstanceDestroy(self, instance: Any) -> int:
        gi_id = handle_value(instance) - GI_BASE
        if self.computes.get(gi_id):
            return int(pynvml.NVML_ERROR_IN_USE)
        del self.instances[gi_id]
        return 0

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, instance: Any, profile: int, engine_profile: int, info: Any
    ) -> int:
        assert engine_profile == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        filled = out(info, pynvml.c_nvmlComputeInstanceProfileInfo_v2_t)
        filled.id = 100 + profile  # distinct from the index, as NVML's may be
        return 0

    def nvmlGpuInstanceCreateComputeInstance(
        self, instance: Any, profile_id: int, compute: Any
    ) -> int:
        gi_id = handle_value(instance) - GI_BASE
        slices = self.instances[gi_id][2] if self.instances[gi_id][2] != 4 else 3
        assert profile_id == 100 + real_mig.COMPUTE_PROFILE_FOR_SLICES[slices]
        ci_id = len(self.computes.setdefault(gi_id, set()))
        self.computes[gi_id].add(ci_id)
        set_handle(compute, pynvml.c_nvmlComputeInstance_t, CI_BASE + gi_id * 16 + ci_id)
        return 0

    def nvmlComputeInstanceGetInfo_v2(self, compute: Any, info: Any) -> int:
        filled = out(info, pynvml.c_nvmlComputeInstanceInfo_t)
        filled.id = (handle_value(compute) - CI_BASE) % 16
        return 0

    def nvmlGpuInstanceGetComputeInstanceById(self, instance: Any, ci_id: int, compute: Any) -> int:
        gi_id = handle_value(instance) - GI_BASE
        if ci_id not in self.computes.get(gi_id, ()):
            return int(pynvml.NVML_ERROR_NOT_FOUND)
        set_handle(compute, pynvml.c_nvmlComputeInstance_t, CI_BASE + gi_id * 16 + ci_id)
        return 0

    def nvmlComputeInstanceDestroy(self, compute: Any) -> int:
        value = handle_value(compute) - CI_BASE
        self.computes[value // 16].discard(value % 16)
        return 0


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLibrary]:
    fake = FakeLibrary()
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", fake.function)
    yield fake


def test_mig_mode_is_set_and_read_back(library: FakeLibrary) -> None:
    nvml = Binding(pynvml)
    mode = real_mig.set_mig_mode(nvml, DEVICE, True)
    assert (mode.current, mode.pending) == (True, True)
    assert library.calls == ["nvmlDeviceSetMigMode", "nvmlDeviceGetMigMode"]


def test_profiles_carry_the_placements_the_library_names(library: FakeLibrary) -> None:
    library.mode = [1, 1]
    profiles = real_mig.read_profiles(Binding(pynvml), DEVICE, placements=True)
    assert [(p.name, p.profile_id) for p in profiles] == [("1g.18gb", 19), ("3g.71gb", 9)]
    assert profiles[1].placements == (Placement(0, 4), Placement(4, 4))
    assert len(profiles[0].placements) == 7


def test_instances_are_created_listed_and_destroyed(library: FakeLibrary) -> None:
    nvml = Binding(pynvml)
    library.mode = [1, 1]
    profiles = real_mig.read_profiles(nvml, DEVICE)
    three = real_mig.create_gpu_instance(nvml, DEVICE, 9, Placement(4, 4))
    one = real_mig.create_gpu_instance(nvml, DEVICE, 19, Placement(2, 1))
    assert (three, one) == (2, 9)
    assert real_mig.create_compute_instance(nvml, DEVICE, three, profiles) == 0
    listed = real_mig.gpu_instances(nvml, DEVICE, profiles, ())
    assert [(gi.gpu_instance_id, gi.profile_id, gi.placement) for gi in listed] == [
        (2, 9, Placement(4, 4)),
        (9, 19, Placement(2, 1)),
    ]
    with pytest.raises(errors.InUse):
        real_mig.destroy_gpu_instance(nvml, DEVICE, three)
    real_mig.destroy_compute_instance(nvml, DEVICE, three, 0)
    real_mig.destroy_gpu_instance(nvml, DEVICE, three)
    assert sorted(library.instances) == [9]


def test_an_instance_that_does_not_fit_is_insufficient_resources(library: FakeLibrary) -> None:
    nvml = Binding(pynvml)
    real_mig.create_gpu_instance(nvml, DEVICE, 19, Placement(0, 1))
    with pytest.raises(errors.InsufficientResources):
        real_mig.create_gpu_instance(nvml, DEVICE, 19, Placement(0, 1))


def test_a_refused_mode_change_is_in_use(library: FakeLibrary) -> None:
    library.refuse["nvmlDeviceSetMigMode"] = pynvml.NVML_ERROR_IN_USE
    with pytest.raises(errors.InUse, match="nvmlDeviceSetMigMode"):
        real_mig.set_mig_mode(Binding(pynvml), DEVICE, False)


def test_placements_a_driver_cannot_name_are_empty(library: FakeLibrary) -> None:
    library.refuse["nvmlDeviceGetGpuInstancePossiblePlacements_v2"] = (
        pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    assert real_mig.read_placements(Binding(pynvml), DEVICE, 19) == ()
