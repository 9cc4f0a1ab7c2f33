"""Event contracts: the envelope, every event and command model, and subject names.

The bottom layer: it imports no NATS. Import the catalogue modules as namespaces,
`from gpuop.events import driver` then `driver.DriverLoaded`.
"""

from gpuop.events.envelope import (
    REGISTRY,
    Command,
    Envelope,
    Event,
    MalformedMessage,
    Payload,
    UnknownEventType,
    bus_subject,
    command_id,
    decode,
    new_command,
    new_event,
    parse_as,
    strict_validate,
)

__all__ = [
    "REGISTRY",
    "Command",
    "Envelope",
    "Event",
    "MalformedMessage",
    "Payload",
    "UnknownEventType",
    "bus_subject",
    "command_id",
    "decode",
    "new_command",
    "new_event",
    "parse_as",
    "strict_validate",
]
