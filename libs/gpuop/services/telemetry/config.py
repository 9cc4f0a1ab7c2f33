"""Telemetry's own settings: how often each role collects, which labels GPU series carry,
where the kubelet's PodResources socket is. Read from the `--config` YAML file
(`GPUOP_CONFIG`); every key is optional:

    interval_seconds: 5              # fast NVML queries, then one render of /metrics
    slow_interval_seconds: 30        # PCIe throughput and batched field values (blocking)
    pods_interval_seconds: 5         # PodResources List, for the pod labels
    retry_interval_seconds: 5        # NVML not available yet, or a publish failed
    labels: [gpu, UUID, pci_bus_id, device, modelName, GPU_I_PROFILE, GPU_I_ID,
             Hostname, DCGM_FI_DRIVER_VERSION, pod, namespace, container]  # + pod_uid
    metrics: null                    # null: every metric; else the names to export
    resource_names: [nvidia.com/gpu] # plus every nvidia.com/mig-* resource
    kubelet_root_dir: /var/lib/kubelet # the kubelet's --root-dir, as the host sees it
    kubelet_socket: null             # <host root><kubelet_root_dir>/pod-resources/kubelet.sock
    ignored_xids: [13, 31, 43, 45, 68, 109]
    kernel_log: false                # XIDs from the host's /dev/kmsg beside NVML's events
    kernel_log_interval_seconds: 2

Called once at start by both roles; tests build `TelemetryConfig` directly.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuop.health import APPLICATION_XIDS
from gpuop.kubelet import constants
from gpuop.runtime.settings import load_config_file
from gpuop.services.telemetry import catalog

POD_RESOURCES_SOCKET = Path(constants.POD_RESOURCES_DIR) / constants.POD_RESOURCES_SOCKET
"""Where the kubelet serves PodResources, relative to the host root, with the default
`kubelet_root_dir`."""
DEFAULT_KUBELET_ROOT_DIR = "/var/lib/kubelet"


class TelemetryConfig(BaseModel):
    """The telemetry service's configuration file."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    interval_seconds: float = Field(default=30.0, ge=0.05, le=3600)
    """Seconds between two collections of the fast NVML queries, each followed by one render
    of the GPU metrics that every scrape until the next one serves. dcgm-exporter's default
    (`--collect-interval` 30000 ms), and the chart's scrape interval: collecting more often
    than Prometheus scrapes renders series nobody reads (it was 5 s, a third of an idle GPU
    node's agent CPU). XID and ECC events do not wait for it: they arrive as NVML events."""
    slow_interval_seconds: float = Field(default=30.0, ge=0.05, le=3600)
    """Seconds between two rounds of the slow queries (PCIe throughput blocks about 21 ms per
    GPU, batched field values about 3.4 ms), on their own loop so they never delay the fast."""
    pods_interval_seconds: float = Field(default=30.0, ge=0.05, le=3600)
    """Seconds between two PodResources `List` calls; labels change only when the answer does.
    With the collection's default, a new pod's series carry its name from the next scrape or
    the one after."""
    retry_interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    """Seconds before NVML is opened again after it failed, or a health event is republished."""
    labels: tuple[str, ...] = catalog.LABELS
    """Labels GPU series carry, from dcgm-exporter's set; leave some out to bound cardinality
    (without pod, namespace and container the kubelet is not asked at all). `pod_uid`, off
    by default as in dcgm-exporter, adds the holding pod's uid, read from the kubelet's pod
    log directories under the host root (`/var/log/pods`, which the chart then mounts)."""
    metrics: tuple[str, ...] | None = None
    """Metric names to export (dcgm-exporter's counters file); None exports every one."""
    resource_names: tuple[str, ...] = ("nvidia.com/gpu",)
    """Extended resources whose devices are GPUs; `nvidia.com/mig-*` resources always are."""
    kubelet_root_dir: str = DEFAULT_KUBELET_ROOT_DIR
    """The node's kubelet `--root-dir`, as the host sees it: the PodResources socket is its
    `pod-resources/kubelet.sock`, under the host root (the chart sets it from
    `nodeAgents.kubeletRootDir`, as the device plugin's `flags.kubeletRootDir`)."""
    kubelet_socket: Path | None = None
    """The kubelet's PodResources socket, whatever `kubelet_root_dir` says; by default the
    one in `kubelet_root_dir` under the host root."""
    ignored_xids: tuple[int, ...] = APPLICATION_XIDS
    """XIDs counted in `DCGM_FI_DEV_XID_ERRORS` but never published as a health change,
    whatever gpuop's XID catalog says of them: an explicit list wins over the catalog. The
    catalog alone already keeps the GPU healthy for the XIDs it resolves `none` or
    `restart-application`; the default, the NVIDIA device plugin's list, adds 109 (the
    catalog resets for it; upstream ignores it as most often a hung application).
    `[]` leaves every XID to the catalog."""

    @field_validator("labels")
    @classmethod
    def _known_labels(cls, labels: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(labels) - set(catalog.KNOWN_LABELS))
        if unknown:
            raise ValueError(f"unknown labels {unknown}; known: {', '.join(catalog.KNOWN_LABELS)}")
        if "UUID" not in labels and "gpu" not in labels:
            raise ValueError("keep UUID or gpu: without either, the GPUs' series collide")
        return tuple(label for label in catalog.KNOWN_LABELS if label in labels)

    @field_validator("kubelet_root_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or ".." in value.split("/"):
            raise ValueError("expected an absolute host path without '..'")
        return value.rstrip("/") or "/"

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, metrics: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if metrics is None:
            return None
        unknown = sorted(set(metrics) - set(catalog.NAMES))
        if unknown:
            raise ValueError(f"unknown metrics {unknown}")
        return metrics

    @property
    def maps_pods(self) -> bool:
        """Whether any pod label is kept, so the kubelet must be asked who owns each GPU."""
        return bool(set(self.labels) & set(catalog.POD_LABELS))

    kernel_log: bool = False
    """Also read XIDs from the host's kernel log (`<host root>/dev/kmsg`): they keep arriving
    when NVML is wedged or the GPU fell off the bus, and an XID both report is acted on once.
    Off by default: the process must be able to open the host's `/dev/kmsg` (a device-cgroup
    allowance for `c 1:11 r`, CAP_SYSLOG where `kernel.dmesg_restrict` is set, and the
    cursor's directory writable), which the chart's unprivileged telemetry container is not
    given; a log it cannot read is reported once and NVML's events still count."""
    kernel_log_interval_seconds: float = Field(default=2.0, ge=0.05, le=3600)
    """Seconds between two reads of the kernel log."""

    def socket_under(self, host_root: Path) -> Path:
        """The PodResources socket for a node whose root is mounted at `host_root`."""
        if self.kubelet_socket is not None:
            return self.kubelet_socket
        kubelet = host_root / self.kubelet_root_dir.lstrip("/")
        return kubelet / constants.POD_RESOURCES / constants.POD_RESOURCES_SOCKET


def load_config(path: Path | None) -> TelemetryConfig:
    """The configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, TelemetryConfig)
