"""Event contracts: the envelope, every event and command model, and subject names.

The bottom layer: it imports no NATS. Import the catalogue modules as namespaces,
`from gpuop.events import driver` then `driver.DriverLoaded`. Importing this package imports
every catalogue module, so `REGISTRY` holds every payload type.
"""

from gpuop.events import (
    deadlines,
    device,
    driver,
    fields,
    hardware,
    ids,
    kube,
    mig,
    network,
    remediation,
    remediations,
    subjects,
    upgrade,
)
from gpuop.events.envelope import (
    REGISTRY,
    Command,
    Envelope,
    Event,
    MalformedMessage,
    Payload,
    UnknownEventType,
    bus_subject,
    decode,
    new_command,
    new_event,
    parse_as,
    strict_validate,
    subject_of,
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
    "deadlines",
    "decode",
    "device",
    "driver",
    "fields",
    "hardware",
    "ids",
    "kube",
    "mig",
    "network",
    "new_command",
    "new_event",
    "parse_as",
    "remediation",
    "remediations",
    "strict_validate",
    "subject_of",
    "subjects",
    "upgrade",
]
