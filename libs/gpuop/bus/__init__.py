"""The event bus: JetStream streams, durable consumers, KV with compare-and-set.

Services depend on the `Bus` protocol; `NatsBus` runs in production, `InMemoryBus` in unit
tests. Import the pieces you need as namespaces:
`from gpuop.bus import errors, protocol`.
"""

from gpuop.bus import _transport  # noqa: F401  # first: nats-py without aiohttp (see there)
from gpuop.bus.errors import (
    BusError,
    BusUnavailable,
    IdTaken,
    KeyExists,
    MessageTooLarge,
    PermanentError,
    PublishTimeout,
    RevisionConflict,
    TemporaryError,
)
from gpuop.bus.jetstream import NatsBus
from gpuop.bus.launcher import NatsCluster, NatsServer
from gpuop.bus.memory import InMemoryBus
from gpuop.bus.protocol import (
    Buckets,
    Bus,
    ConsumerSpec,
    Delivery,
    KeyValue,
    KvEntry,
    PublishAck,
    StoredMessage,
    Subscription,
    UnknownErrors,
)

__all__ = [
    "Buckets",
    "Bus",
    "BusError",
    "BusUnavailable",
    "ConsumerSpec",
    "Delivery",
    "IdTaken",
    "InMemoryBus",
    "KeyExists",
    "KeyValue",
    "KvEntry",
    "MessageTooLarge",
    "NatsBus",
    "NatsCluster",
    "NatsServer",
    "PermanentError",
    "PublishAck",
    "PublishTimeout",
    "RevisionConflict",
    "StoredMessage",
    "Subscription",
    "TemporaryError",
    "UnknownErrors",
]
