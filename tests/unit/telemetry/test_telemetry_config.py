"""Telemetry's configuration file: defaults, allowlists checked against what exists, and
errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuop.runtime.settings import SettingsError
from gpuop.services.telemetry import catalog
from gpuop.services.telemetry.config import TelemetryConfig, load_config


def test_without_a_file_every_label_and_metric_is_on_and_pods_are_mapped() -> None:
    config = load_config(None)

    assert config.labels == catalog.LABELS
    assert config.metrics is None
    assert config.maps_pods
    assert config.socket_under(Path("/host")) == Path(
        "/host/var/lib/kubelet/pod-resources/kubelet.sock"
    )


def test_a_file_sets_intervals_and_allowlists(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.yaml"
    path.write_text(
        "interval_seconds: 1\n"
        "labels: [pod, UUID, gpu]\n"
        "metrics: [DCGM_FI_DEV_GPU_TEMP]\n"
        "kubelet_socket: /run/pr.sock\n"
        "kubelet_root_dir: /data/kubelet\n"
    )

    config = load_config(path)

    assert config.interval_seconds == 1
    assert config.labels == ("gpu", "UUID", "pod")  # in dcgm-exporter's order
    assert config.metrics == ("DCGM_FI_DEV_GPU_TEMP",)
    assert config.socket_under(Path("/host")) == Path("/run/pr.sock")


def test_without_pod_labels_the_kubelet_is_not_needed() -> None:
    assert not TelemetryConfig(labels=("gpu", "UUID", "Hostname")).maps_pods


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("labels: [gpu, pod_name]\n", "labels"),
        ("labels: [modelName, Hostname]\n", "UUID or gpu"),
        ("metrics: [DCGM_FI_DEV_NOT_A_THING]\n", "metrics"),
        ("interval_seconds: 0\n", "interval_seconds"),
        ("kubelet_root_dir: var/lib/kubelet\n", "kubelet_root_dir"),
        ("kubelet_root_dir: /data/../kubelet\n", "kubelet_root_dir"),
        ("scrape_me: true\n", "scrape_me"),
        ("- just\n- a list\n", "mapping"),
        ("interval_seconds: [unclosed\n", "cannot read"),
    ],
)
def test_a_malformed_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, content: str, complaint: str
) -> None:
    path = tmp_path / "telemetry.yaml"
    path.write_text(content)

    with pytest.raises(SettingsError) as refused:
        load_config(path)

    assert str(path) in str(refused.value)
    assert complaint in str(refused.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_the_model_itself_refuses_unknown_labels() -> None:
    with pytest.raises(ValidationError):
        TelemetryConfig(labels=("gpu", "exported_pod"))
