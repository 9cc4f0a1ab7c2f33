"""The NVLink clique from NVML's fabric info: `<clusterUuid>.<cliqueId>` once the fabric
manager registered the GPU, nothing where the GPU has no fabric (the recorded H200)."""

from __future__ import annotations

import dataclasses
import types
import uuid
from typing import Any

import pynvml as real
import pytest

from gpuop.inventory.scanning import gpu_record
from gpuop.nvml.binding import Binding
from gpuop.nvml.protocol import opened
from gpuop.nvml.real import FABRIC_COMPLETED, PynvmlBackend, fabric_clique
from tests.support.fake_pynvml import FakePynvml

from .conftest import NVML_JSON

CLUSTER = uuid.UUID("6f1c2a9e-0b7d-4c35-9a8e-2f4b1d0c7e55")


def module(state: int = FABRIC_COMPLETED, status: int = 0, code: int | None = None) -> Any:
    fake = types.SimpleNamespace(NVMLError=real.NVMLError)
    fake.c_nvmlGpuFabricInfo_t = real.c_nvmlGpuFabricInfo_t

    def answer(handle: object, pointer: Any) -> int:
        if code is not None:
            raise real.NVMLError(code)
        info = pointer._obj
        for i, byte in enumerate(CLUSTER.bytes):
            info.clusterUuid[i] = byte
        info.cliqueId, info.state, info.status = 32766, state, status
        return 0

    fake.nvmlDeviceGetGpuFabricInfo = answer
    return fake


def test_a_registered_gpu_is_in_its_clusters_clique() -> None:
    assert fabric_clique(Binding(module()), object()) == f"{CLUSTER}.32766"


@pytest.mark.parametrize(
    "fake",
    [
        module(state=2),  # NVML_GPU_FABRIC_STATE_IN_PROGRESS
        module(status=real.NVML_ERROR_UNKNOWN),  # the registration failed
        module(code=real.NVML_ERROR_NOT_SUPPORTED),  # no multi-node fabric: an HGX H200
        types.SimpleNamespace(NVMLError=real.NVMLError),  # a binding without the call
    ],
)
def test_no_clique_until_a_registration_completed(fake: Any) -> None:
    assert fabric_clique(Binding(fake), object()) is None


def test_the_recorded_h200_has_no_clique_and_its_inventory_says_none() -> None:
    fake = FakePynvml(NVML_JSON)
    with opened(PynvmlBackend(fake.module)) as backend:
        info = backend.device_info(0)
    assert info.fabric_clique is None
    assert gpu_record(info).clique is None
    clique = f"{CLUSTER}.7"
    assert gpu_record(dataclasses.replace(info, fabric_clique=clique)).clique == clique
