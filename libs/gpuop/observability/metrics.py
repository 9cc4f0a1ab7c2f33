"""The process's Prometheus registry, and the metrics the bus keeps about its own traffic.

`registry()` is the one registry a service exposes on `/metrics` (see `http.HealthServer`);
every module that defines metrics registers them there, never on prometheus_client's global
default. The bus constructs `BusMetrics` on that registry and counts each publish, each
consumed message's outcome, redeliveries, dead letters and handler durations.

Labels stay low-cardinality so a cluster of thousands of nodes does not become thousands of
series per metric: `kind`, `outcome` and `reason` come from the small vocabularies below, and
`consumer` is the durable consumer's role name (for example `driver-manager`), never a full
subject or a node name.

Series exposed by `BusMetrics`:

- `gpuop_bus_published_total{kind}`: messages published; kind is evt, cmd or dlq.
- `gpuop_bus_consumed_total{consumer,outcome}`: one per message handled; outcome is acked,
  retried, dead_lettered or unknown_type.
- `gpuop_bus_redelivered_total{consumer}`: deliveries the server had already made before.
- `gpuop_bus_dead_lettered_total{consumer,reason}`: reason is malformed, permanent or
  max_deliver.
- `gpuop_bus_unknown_types_total{consumer}`: messages of a type this version does not know.
- `gpuop_bus_handler_seconds{consumer}`: how long handlers ran.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Final, Literal, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from gpuop.events import subjects

PublishKind = Literal["evt", "cmd", "dlq"]
ConsumeOutcome = Literal["acked", "retried", "dead_lettered", "unknown_type"]
DeadLetterReason = Literal["malformed", "permanent", "max_deliver"]

PUBLISH_KINDS: Final[tuple[PublishKind, ...]] = get_args(PublishKind)
CONSUME_OUTCOMES: Final[tuple[ConsumeOutcome, ...]] = get_args(ConsumeOutcome)
DEAD_LETTER_REASONS: Final[tuple[DeadLetterReason, ...]] = get_args(DeadLetterReason)

# From a millisecond ack to a handler that waits on the Kubernetes API for a minute or two.
HANDLER_SECONDS_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip

_process_registry: CollectorRegistry | None = None
_lock = threading.Lock()


def registry() -> CollectorRegistry:
    """The registry this process serves on `/metrics`, with the standard process metrics."""
    global _process_registry
    with _lock:
        if _process_registry is None:
            created = CollectorRegistry()
            ProcessCollector(registry=created)
            PlatformCollector(registry=created)
            GCCollector(registry=created)
            _process_registry = created
        return _process_registry


@dataclass(frozen=True)
class _BusFamilies:
    published: Counter
    consumed: Counter
    redelivered: Counter
    dead_lettered: Counter
    unknown_types: Counter
    handler_seconds: Histogram
    ids_taken: Counter


# A registry refuses a second metric of the same name, and tests build many buses on one
# registry, so each registry's families are created once and shared.
_families: weakref.WeakKeyDictionary[CollectorRegistry, _BusFamilies] = weakref.WeakKeyDictionary()


def _families_on(target: CollectorRegistry) -> _BusFamilies:
    with _lock:
        families = _families.get(target)
        if families is None:
            families = _BusFamilies(
                published=Counter(
                    "gpuop_bus_published",
                    "Messages published to the bus, by kind (evt, cmd, dlq).",
                    ["kind"],
                    registry=target,
                ),
                consumed=Counter(
                    "gpuop_bus_consumed",
                    "Messages a consumer finished with, by outcome.",
                    ["consumer", "outcome"],
                    registry=target,
                ),
                redelivered=Counter(
                    "gpuop_bus_redelivered",
                    "Deliveries of messages the server had delivered to the consumer before.",
                    ["consumer"],
                    registry=target,
                ),
                dead_lettered=Counter(
                    "gpuop_bus_dead_lettered",
                    "Messages terminated and written to the dead-letter stream, by reason.",
                    ["consumer", "reason"],
                    registry=target,
                ),
                unknown_types=Counter(
                    "gpuop_bus_unknown_types",
                    "Messages of a type this version does not know, acked without handling.",
                    ["consumer"],
                    registry=target,
                ),
                handler_seconds=Histogram(
                    "gpuop_bus_handler_seconds",
                    "Time a consumer's handler took for one message.",
                    ["consumer"],
                    buckets=HANDLER_SECONDS_BUCKETS,
                    registry=target,
                ),
                ids_taken=Counter(
                    "gpuop_bus_ids_taken",
                    "First publishes the server answered as duplicates: another publisher "
                    "stored the message id first (an alarm: the message was not stored).",
                    ["kind"],
                    registry=target,
                ),
            )
            for kind in PUBLISH_KINDS:
                families.published.labels(kind=kind)
                families.ids_taken.labels(kind=kind)
            _families[target] = families
        return families


class BusMetrics:
    """The bus's counters on one registry; any number of instances may share a registry."""

    def __init__(self, target: CollectorRegistry) -> None:
        self._families = _families_on(target)
        # `labels()` takes a lock and builds a key on every call; the label sets are few
        self._published: dict[str, Counter] = {}
        self._consumed: dict[tuple[str, str], Counter] = {}
        self._handler_seconds: dict[str, Histogram] = {}

    def declare_consumer(self, consumer: str) -> None:
        """Create the consumer's series at zero, so `rate()` sees its very first message."""
        families = self._families
        for outcome in CONSUME_OUTCOMES:
            families.consumed.labels(consumer=consumer, outcome=outcome)
        for reason in DEAD_LETTER_REASONS:
            families.dead_lettered.labels(consumer=consumer, reason=reason)
        families.redelivered.labels(consumer=consumer)
        families.unknown_types.labels(consumer=consumer)
        families.handler_seconds.labels(consumer=consumer)

    def published(self, kind: PublishKind | subjects.Kind) -> None:
        """Count one message published (an event, a command or a dead letter)."""
        child = self._published.get(kind)
        if child is None:
            label = _checked(str(kind), PUBLISH_KINDS)
            child = self._published[kind] = self._families.published.labels(kind=label)
        child.inc()

    def id_taken(self, kind: PublishKind | subjects.Kind) -> None:
        """Count a first publish answered as a duplicate (`gpuop.bus.errors.IdTaken`)."""
        self._families.ids_taken.labels(kind=_checked(str(kind), PUBLISH_KINDS)).inc()

    def consumed(self, consumer: str, outcome: ConsumeOutcome) -> None:
        """Count one message `consumer` finished with; every message gets exactly one."""
        child = self._consumed.get((consumer, outcome))
        if child is None:
            label = _checked(outcome, CONSUME_OUTCOMES)
            child = self._families.consumed.labels(consumer=consumer, outcome=label)
            self._consumed[consumer, outcome] = child
        child.inc()

    def redelivered(self, consumer: str) -> None:
        """Count a delivery whose attempt number is above one."""
        self._families.redelivered.labels(consumer=consumer).inc()

    def dead_lettered(self, consumer: str, reason: DeadLetterReason) -> None:
        """Count a dead letter and why; the outcome is counted separately by `consumed`."""
        label = _checked(reason, DEAD_LETTER_REASONS)
        self._families.dead_lettered.labels(consumer=consumer, reason=label).inc()

    def unknown_type(self, consumer: str) -> None:
        """Count a message of a type this version does not know."""
        self._families.unknown_types.labels(consumer=consumer).inc()

    def observe_handler(self, consumer: str, seconds: float) -> None:
        """Record how long one handler call took, as measured on the bus's clock."""
        child = self._handler_seconds.get(consumer)
        if child is None:
            child = self._handler_seconds[consumer] = self._families.handler_seconds.labels(
                consumer=consumer
            )
        child.observe(seconds)


def _checked(value: str, allowed: tuple[str, ...]) -> str:
    # Typed callers cannot pass anything else, but a label value must never come from data.
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
    return value
