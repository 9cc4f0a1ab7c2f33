"""What the node exporter reports about itself, on the service's registry (`gpuop_telemetry_*`).

These are ordinary prometheus_client metrics, rendered by the registry on each scrape; the
GPU metrics themselves are pre-rendered text (`exposition`). Labels come from fixed
vocabularies: `loop` is fast or slow, `query` one of `QUERIES`, `reason` a `HealthReason`.
"""

from __future__ import annotations

from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuop.events.device import HealthReason

Loop = Literal["fast", "slow"]
Query = Literal["open", "metrics", "pcie", "fields", "gpm", "events"]
QUERIES: Final[tuple[Query, ...]] = ("open", "metrics", "pcie", "fields", "gpm", "events")
COLLECTION_SECONDS_BUCKETS: Final = (0.001, 0.005, 0.025, 0.1, 0.5, 2.5)
"""Few buckets: every scrape renders the registry, and a histogram costs a line a bucket."""


XID_OUTCOMES = (
    ("nvml", "acted"),
    ("nvml", "duplicate"),
    ("kernel-log", "acted"),
    ("kernel-log", "duplicate"),
    ("kernel-log", "unknown-gpu"),
)
"""The label pairs of `gpuop_telemetry_xids`, each exported from the start at 0."""


class ExporterMetrics:
    """The node exporter's own series on one registry."""

    def __init__(self, registry: CollectorRegistry, *, maps_pods: bool = True) -> None:
        self.collection_seconds = Histogram(
            "gpuop_telemetry_collection_seconds",
            "Wall time of one collection, by loop (fast metrics and their render, slow PCIe"
            " and field queries); its count is the number of collections.",
            ["loop"],
            buckets=COLLECTION_SECONDS_BUCKETS,
            registry=registry,
        )
        self.collector_cpu_seconds = Counter(
            "gpuop_telemetry_collector_cpu_seconds",
            "CPU time of the threads that collected and rendered, by loop.",
            ["loop"],
            registry=registry,
        )
        self.last_collection = Gauge(
            "gpuop_telemetry_last_collection_timestamp_seconds",
            "When the GPU metrics served now were collected (Unix time); stale if it lags.",
            registry=registry,
        )
        self.gpus = Gauge(
            "gpuop_telemetry_gpus",
            "GPUs whose metrics the last collection read.",
            registry=registry,
        )
        self.nvml_errors = Counter(
            "gpuop_telemetry_nvml_errors",
            "NVML failures, by query; the GPU's series are left out until it answers again.",
            ["query"],
            registry=registry,
        )
        self.pod_resources_up: Gauge | None = None
        """Absent when no pod label is kept and the kubelet is never asked."""
        if maps_pods:
            self.pod_resources_up = Gauge(
                "gpuop_telemetry_pod_resources_up",
                "1 when the last PodResources List answered, 0 when the kubelet could not be"
                " asked.",
                registry=registry,
            )
        self.paused = Gauge(
            "gpuop_telemetry_paused",
            "1 while the operands are paused for a driver reload and NVML is closed.",
            registry=registry,
        )
        self.health_events = Counter(
            "gpuop_telemetry_health_events",
            "device.health-changed events published, by reason.",
            ["reason"],
            registry=registry,
        )
        self.health_events_pending = Gauge(
            "gpuop_telemetry_health_events_pending",
            "Health events detected but not yet published (the bus is unreachable).",
            registry=registry,
        )
        self.xid_sources = Counter(
            "gpuop_telemetry_xids",
            "XIDs read, by source (nvml, kernel-log) and outcome: acted on, a duplicate of the"
            " other source's, or (kernel log) on a PCI address no known GPU has.",
            ["source", "outcome"],
            registry=registry,
        )
        self.kernel_log_lost = Counter(
            "gpuop_telemetry_kernel_log_lost_records",
            "Kernel log records the ring overwrote before telemetry read them.",
            registry=registry,
        )
        for source, outcome in XID_OUTCOMES:
            self.xid_sources.labels(source=source, outcome=outcome)
        for loop in ("fast", "slow"):
            self.collection_seconds.labels(loop=loop)
            self.collector_cpu_seconds.labels(loop=loop)
        for query in QUERIES:
            self.nvml_errors.labels(query=query)
        for reason in HealthReason:
            self.health_events.labels(reason=reason.value)

    def collected(self, loop: Loop, *, seconds: float, cpu_seconds: float) -> None:
        """Count one collection and what it cost."""
        self.collection_seconds.labels(loop=loop).observe(seconds)
        self.collector_cpu_seconds.labels(loop=loop).inc(cpu_seconds)

    def nvml_failed(self, query: Query, count: int = 1) -> None:
        if count:
            self.nvml_errors.labels(query=query).inc(count)
