"""NVIDIA's real NVML library on a machine without the driver: Debian's `libnvidia-ml1`
535.261.03 (fetched and unpacked, never installed: `tests.support.nvml_library`) under the
real `PynvmlBackend`, in a process of its own whose `LD_LIBRARY_PATH` holds the library and
whose `/dev` is private. `nvmlInit` answers `NVML_ERROR_DRIVER_NOT_LOADED`, and discovery,
telemetry and the device plugin (`tests.support.nvml_probe`) do with it exactly what they do
on a simulated node whose driver is not loaded yet: the same inventory, the same readiness,
the same retries, each failure logged once; and `gpuop discover --nvml real` prints what
`--nvml sim:8` prints for the node."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import nvml_library, nvml_probe
from tests.support.driver_packages import REPOSITORY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

Findings = dict[str, Any]


@pytest.fixture(scope="module")
def library() -> Path:
    for tool in ("apt-get", "dpkg-deb", "unshare", "mount", "mknod"):
        if shutil.which(tool) is None:
            pytest.fail(
                f"{tool} is not installed: apt-get install dpkg util-linux mount coreutils "
                "(with Debian's archive reachable for apt)"
            )
    return nvml_library.real_nvml_library()


def probe(kind: str, directory: Path, environ: dict[str, str]) -> Findings:
    command = [sys.executable, "-m", "tests.support.nvml_probe", kind, str(directory / kind)]
    found: Findings = json.loads(run(command, environ, f"the {kind} probe"))
    return found


def run(command: list[str], environ: dict[str, str], what: str) -> str:
    """`command`'s output, run in a private `/dev` with `environ`."""
    result = subprocess.run(
        nvml_library.in_private_dev(command),
        env=environ,
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, f"{what} failed:\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def machine_devices() -> list[str]:
    """The machine's own NVIDIA device nodes before any probe ran."""
    return sorted(p.name for p in Path("/dev").glob("nvidia*"))


@pytest.fixture(scope="module")
def findings(
    library: Path, machine_devices: list[str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Findings, Findings]:
    directory = tmp_path_factory.mktemp("nvml")
    real = probe("real", directory, nvml_library.environment(library))
    sim = probe("sim", directory, nvml_library.environment(directory / "no-library"))
    return real, sim


def test_the_real_library_answers_nvml_init_with_driver_not_loaded(
    findings: tuple[Findings, Findings], library: Path
) -> None:
    real, sim = findings
    assert real["library"] == str(library / "libnvidia-ml.so.535.261.03")
    assert real["init"] == {
        "type": "DriverNotLoaded",
        "code": 9,  # NVML_ERROR_DRIVER_NOT_LOADED
        "message": "nvmlInit: Driver Not Loaded",
    }
    assert sim["library"] is None
    assert sim["init"]["type"] == "DriverNotLoaded"


def test_discovery_publishes_the_inventory_of_a_node_without_a_driver(
    findings: tuple[Findings, Findings],
) -> None:
    real, sim = findings
    assert real["discovery"]["gpus"] == 0
    assert real["discovery"]["driver_version"] is None
    assert real["discovery"]["pci_functions"] > 0
    assert real["discovery"]["readiness"] == [[True, ""]]
    assert real["discovery"] == sim["discovery"], "the same inventory, hash and all"


def test_telemetry_is_not_ready_serves_nothing_and_retries_naming_the_driver(
    findings: tuple[Findings, Findings],
) -> None:
    real, sim = findings
    for found, reason in (
        (real, "NVML failed: nvmlInit: Driver Not Loaded"),
        (sim, "NVML failed: the nvidia kernel module is not loaded"),
    ):
        telemetry = found["telemetry"]
        assert telemetry["failed_opens"] >= 3, "NVML is tried again every retry interval"
        assert {tuple(r) for r in telemetry["readiness"]} == {(False, reason)}
        assert telemetry["exposition_bytes"] == 0
        assert not telemetry["session_open"]


def test_the_device_plugin_registers_nothing_and_is_not_ready_naming_the_driver(
    findings: tuple[Findings, Findings],
) -> None:
    real, sim = findings
    assert real["device_plugin"] == {
        "readiness": [False, "NVML cannot be used: nvmlInit: Driver Not Loaded"],
        "registrations": [],
        "session_open": False,
    }
    assert sim["device_plugin"]["registrations"] == []
    assert sim["device_plugin"]["readiness"][0] is False


def test_each_service_logs_the_missing_driver_once_however_often_it_retries(
    findings: tuple[Findings, Findings],
) -> None:
    real, sim = findings
    assert real["logged"] == [
        "WARNING gpuop.services.telemetry.node_exporter: NVML failed: nvmlInit: Driver Not "
        "Loaded; retrying every 0.1s",
        "WARNING gpuop.services.device_plugin.plugins: NVML cannot be used: nvmlInit: Driver "
        "Not Loaded; retrying every 0.2 s",
    ]
    assert len(sim["logged"]) == len(real["logged"])


def test_nvml_makes_its_control_device_in_the_private_dev_only(
    findings: tuple[Findings, Findings], machine_devices: list[str]
) -> None:
    real, sim = findings
    assert real["device_nodes"] == ["nvidiactl"], "the real library, as root, mknods it"
    assert sim["device_nodes"] == []
    assert sorted(p.name for p in Path("/dev").glob("nvidia*")) == machine_devices


def test_gpuop_discover_with_nvml_real_reports_the_node_as_the_simulation_does(
    library: Path, tmp_path: Path
) -> None:
    root = nvml_probe.host_without_driver(tmp_path / "host")
    discover = [sys.executable, "-m", "gpuop.cli.main", "discover", "--host-root", str(root.path)]
    real = json.loads(
        run([*discover, "--nvml", "real", "--json"], nvml_library.environment(library), "real")
    )
    sim = json.loads(
        run([*discover, "--nvml", "sim:8", "--json"], nvml_library.environment(tmp_path), "sim")
    )
    assert real["inventory"]["gpus"] == []
    assert real["inventory"]["driver_version"] is None
    assert real == sim
