"""The `pod_uid` label (dcgm-exporter's `--kubernetes-enable-pod-uid`): off by default, and
when asked for, each holding pod's uid read from the kubelet's pod log directories under the
host root; a pod without one, or a node where they cannot be read, keeps its series without
it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.services.telemetry import catalog
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop.services.telemetry.pod_uids import POD_LOGS, PodUids, parse
from gpuop.services.telemetry.pods import DeviceAssignment, InMemoryPodResources, Owner
from tests.support import charts
from tests.support.node_agents import NODE
from tests.support.telemetry import QUIET, CountingNvml, series, uuid_of

TRAINER = Owner("ml", "trainer-0", "main")
NOTEBOOK = Owner("ml", "notebook", "lab")
UID = "3f1c9a52-7d2e-4b8a-9c61-0e5d2f7a8b94"


def test_a_pod_log_directory_names_namespace_name_and_uid() -> None:
    assert parse(f"ml_trainer-0_{UID}") == (("ml", "trainer-0"), UID)
    for other in ("ml_trainer-0", f"ml_trainer_0_{UID}", f"_trainer-0_{UID}", "lost+found"):
        assert parse(other) is None, other


def test_the_listing_maps_each_pods_directory_and_ignores_the_rest(tmp_path: Path) -> None:
    logs = tmp_path / POD_LOGS
    (logs / f"ml_trainer-0_{UID}").mkdir(parents=True)
    (logs / "not-a-pod").mkdir()
    (logs / f"ml_file_{UID}").write_text("")  # a file, not a pod's directory

    assert PodUids(tmp_path).read() == {("ml", "trainer-0"): UID}


def test_an_unreadable_directory_gives_no_uids_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uids = PodUids(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert uids.read() == {}
        assert uids.read() == {}

    assert len([r for r in caplog.records if "pod_uid" in r.getMessage()]) == 1


async def exported(
    tmp_path: Path, nvml: CountingNvml, labels: tuple[str, ...]
) -> list[dict[str, str]]:
    (tmp_path / POD_LOGS / f"ml_trainer-0_{UID}").mkdir(parents=True)
    kubelet = InMemoryPodResources(
        [
            DeviceAssignment("nvidia.com/gpu", uuid_of(0), TRAINER),
            DeviceAssignment("nvidia.com/gpu", uuid_of(1), NOTEBOOK),  # no log directory yet
        ]
    )
    bus = InMemoryBus()
    config = TelemetryConfig.model_validate({**QUIET.model_dump(), "labels": labels})
    exporter = NodeExporter(
        bus,
        NODE,
        nvml,
        config,
        CollectorRegistry(),
        pod_resources=kubelet,
        pod_uids=PodUids(tmp_path),
    )
    await exporter.collect()
    await exporter.refresh_pods()
    await exporter.collect()
    await exporter.session.close()
    return [labels for labels, _ in series(exporter.exposition(), "DCGM_FI_DEV_FB_USED")]


async def test_pod_uid_labels_the_series_of_a_pod_whose_uid_the_node_knows(
    tmp_path: Path, nvml: CountingNvml
) -> None:
    found = await exported(tmp_path, nvml, (*catalog.LABELS, catalog.POD_UID))

    by_gpu = {labels["gpu"]: labels for labels in found}
    assert by_gpu["0"]["pod_uid"] == UID
    assert list(by_gpu["0"])[-4:] == ["pod", "namespace", "container", "pod_uid"]
    assert by_gpu["1"]["pod"] == "notebook" and "pod_uid" not in by_gpu["1"]


async def test_pod_uid_is_off_by_default(tmp_path: Path, nvml: CountingNvml) -> None:
    found = await exported(tmp_path, nvml, TelemetryConfig().labels)

    assert catalog.POD_UID not in TelemetryConfig().labels
    assert all("pod_uid" not in labels for labels in found)
    assert {labels.get("pod") for labels in found} >= {"trainer-0", "notebook"}


def test_pod_uid_is_a_label_a_configuration_may_name() -> None:
    config = TelemetryConfig.model_validate({"labels": ["UUID", "pod", "pod_uid"]})
    assert config.labels == ("UUID", "pod", "pod_uid")
    with pytest.raises(ValueError, match="unknown labels"):
        TelemetryConfig.model_validate({"labels": ["UUID", "pod_labels"]})


def telemetry_mounts(labels: list[str] | None) -> dict[str, bool]:
    overrides = {"telemetry": {"config": {"labels": labels}}} if labels else None
    daemonset = charts.render_with(overrides).get("DaemonSet", "gpuop-telemetry")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}


def test_the_chart_mounts_the_pod_log_directories_read_only_only_for_pod_uid() -> None:
    default = telemetry_mounts(None)
    with_uid = telemetry_mounts(["UUID", "pod", "pod_uid"])

    assert not any(path.endswith("/var/log/pods") for path in default)
    assert [ro for path, ro in with_uid.items() if path.endswith("/var/log/pods")] == [True]
