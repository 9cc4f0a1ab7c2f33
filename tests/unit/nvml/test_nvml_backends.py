"""`--nvml real|sim:<gpus>|recorded:<file>` to a backend, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.nvml import errors
from gpuop.nvml.backends import open_backend
from gpuop.nvml.protocol import inventory, opened
from gpuop.nvml.real import PynvmlBackend
from gpuop.nvml.recorded import RecordedNvml
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.hosts import write_host_root

from .conftest import NVML_JSON


def test_real_is_nvidia_ml_py(tmp_path: Path) -> None:
    assert isinstance(open_backend("real", host_root=tmp_path, node="n1"), PynvmlBackend)


def test_sim_simulates_the_node_on_the_host_roots_driver(tmp_path: Path) -> None:
    write_host_root(tmp_path)
    nvml = open_backend("sim:8", host_root=tmp_path, node="n1", holder_id="discovery")
    assert isinstance(nvml, SimNvml)
    with opened(nvml):
        uuids = {gpu.uuid for gpu in inventory(nvml)}
        assert (tmp_path / "run/gpuop/sim-kernel/holders/nvidia/discovery").is_file()
    assert len(uuids) == 8
    other = open_backend("sim:8", host_root=tmp_path, node="n2")
    with opened(other):
        assert uuids.isdisjoint(gpu.uuid for gpu in inventory(other))


def test_sim_without_a_loaded_driver_cannot_init(tmp_path: Path) -> None:
    nvml = open_backend("sim:2", host_root=tmp_path, node="n1")
    with pytest.raises(errors.DriverNotLoaded):
        nvml.init()


def test_recorded_answers_from_the_file(tmp_path: Path) -> None:
    nvml = open_backend(f"recorded:{NVML_JSON}", host_root=tmp_path, node="n1")
    assert isinstance(nvml, RecordedNvml)
    with opened(nvml):
        assert nvml.device_info(0).name == "NVIDIA H200"


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("", "expected real, sim:<gpus>"),
        ("fake", "expected real, sim:<gpus>"),
        ("real:1", "expected real, sim:<gpus>"),
        ("sim", "from 1 to 64"),
        ("sim:", "from 1 to 64"),
        ("sim:0", "from 1 to 64"),
        ("sim:65", "from 1 to 64"),
        ("sim:eight", "from 1 to 64"),
        ("sim:-1", "from 1 to 64"),
        ("recorded:", "name the recorded nvml.json"),
        ("recorded:/nonexistent/nvml.json", "no recording at"),
    ],
)
def test_bad_specs_are_refused(tmp_path: Path, spec: str, complaint: str) -> None:
    with pytest.raises(errors.InvalidBackendSpec, match=complaint):
        open_backend(spec, host_root=tmp_path, node="n1")


def test_an_unreadable_recording_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "nvml.json"
    garbage.write_text("not json")
    with pytest.raises(errors.InvalidBackendSpec, match="not a usable NVML recording"):
        open_backend(f"recorded:{garbage}", host_root=tmp_path, node="n1")
    assert issubclass(errors.InvalidBackendSpec, ValueError)
