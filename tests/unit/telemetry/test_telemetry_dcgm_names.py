"""Telemetry's metric names and types are dcgm-exporter's, checked against its published
metric lists (`dcgm_exporter/`, copied from its repository with their source in `SOURCE`):
a family renamed, retyped or invented fails here, not in a user's dashboard."""

from __future__ import annotations

from pathlib import Path

from gpuop.services.telemetry import catalog
from tests.support.telemetry import ISSUE_38

PUBLISHED = Path(__file__).parent / "dcgm_exporter"
OWN = {catalog.POD_INFO.name}
"""gpuop's own families, named `gpuop_*` so no one takes them for dcgm-exporter's."""
NOT_FROM_NVML = {
    "DCGM_FI_DEV_DEC_UTIL": "dcgm-exporter's default, not exported yet: the decoder query",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU only; gpuop runs on bare-metal and passthrough",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "GPM has no graphics-engine activity (SM activity is)",
    "DCGM_FI_DRIVER_VERSION": "a label of every series, not a family",
}
"""dcgm-exporter's default and profiling names telemetry does not export, and why."""
OTHER_TYPE = {
    "DCGM_EXP_XID_ERRORS_COUNT": "gauge",  # a count over the last 5 minutes falls as XIDs
    # age out: declared a counter, rate() would read each fall as a reset
}
"""Where telemetry declares another type than dcgm-exporter's CSV, on purpose."""


def published(name: str) -> dict[str, set[str]]:
    """Counter name to its declared types, from one dcgm-exporter CSV, commented lines too
    (counters it knows but leaves off by default)."""
    found: dict[str, set[str]] = {}
    for line in (PUBLISHED / name).read_text().splitlines():
        fields = [field.strip() for field in line.lstrip("# ").split(",")]
        if len(fields) >= 3 and fields[0].startswith("DCGM_"):
            found.setdefault(fields[0], set()).add(fields[1])
    return found


def enabled_by_default(name: str) -> set[str]:
    lines = (PUBLISHED / name).read_text().splitlines()
    return {
        line.split(",")[0].strip() for line in lines if line.startswith("DCGM_") and "," in line
    }


def field_names() -> set[str]:
    lines = (PUBLISHED / "dcgm-field-names.txt").read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def exported() -> dict[str, str]:
    metrics = (*catalog.METRICS, catalog.XID_COUNT)
    return {metric.name: str(metric.kind) for metric in metrics}


def test_every_family_is_a_published_dcgm_exporter_counter_of_the_same_type() -> None:
    known = published("default-counters.csv")
    for name, types in published("dcp-metrics-included.csv").items():
        known.setdefault(name, set()).update(types)
    fields = field_names()

    for name, kind in exported().items():
        if name in OTHER_TYPE:
            assert kind == OTHER_TYPE[name] and kind not in known[name], name
        elif name in known:
            assert kind in known[name], (name, kind, known[name])
        else:  # named by a DCGM field dcgm-exporter accepts, though in neither list
            assert name in fields, name
    assert catalog.NAMES - set(exported()) == OWN


def test_the_names_of_issue_38_are_published_under_those_names() -> None:
    known = set(published("default-counters.csv")) | set(published("dcp-metrics-included.csv"))
    names = set(exported())
    remaps = {
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    }
    pcie = {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}
    nvlink_bytes = {"DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"}
    for name in (ISSUE_38 | remaps | pcie) - nvlink_bytes:
        assert name in known and name in names, name
    for name in nvlink_bytes:  # in no CSV: named by the DCGM field dcgm-exporter accepts
        assert name in field_names() and name in names, name


def test_every_default_and_profiling_counter_is_exported_or_said_why_not() -> None:
    defaults = enabled_by_default("default-counters.csv")
    defaults |= enabled_by_default("dcp-metrics-included.csv")

    assert defaults - set(exported()) == set(NOT_FROM_NVML)
