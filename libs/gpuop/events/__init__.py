"""Event contracts: the envelope, every event and command model, and subject names.

The bottom layer: it imports no NATS. Import the catalogue modules as namespaces,
`from gpuop.events import driver` then `driver.DriverLoaded`. Importing this package imports
every catalogue module, so `REGISTRY` holds every payload type.

Each saga kind's contract is named one way: `<kind>` is the kind's public face (its domain,
published by the upgrade orchestrator alone: `upgrade`, `remediation`, `mig`),
`<kind>_commands` the commands its saga sends node agents and their answers
(`remediation_commands`, `mig_commands`, `device_api_commands`; the upgrade's are the
driver-manager's own `driver`), and `<kind>_requests` what another service publishes to start one
(`mig_requests`). The other modules are one domain each (`device`, `dra`, `driver`, `hardware`,
`kube`, `network`) or the shared parts (`envelope`, `fields`, `ids`, `subjects`).
"""

from gpuop.events import (
    deadlines,
    device,
    device_api_commands,
    dra,
    driver,
    fields,
    hardware,
    ids,
    kube,
    mig,
    mig_commands,
    mig_requests,
    network,
    remediation,
    remediation_commands,
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
    SubjectMismatch,
    UnknownEventType,
    bus_subject,
    check_subject,
    decode,
    decode_on,
    event_names,
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
    "SubjectMismatch",
    "UnknownEventType",
    "bus_subject",
    "check_subject",
    "deadlines",
    "decode",
    "decode_on",
    "device",
    "device_api_commands",
    "dra",
    "driver",
    "event_names",
    "fields",
    "hardware",
    "ids",
    "kube",
    "mig",
    "mig_commands",
    "mig_requests",
    "network",
    "new_command",
    "new_event",
    "parse_as",
    "remediation",
    "remediation_commands",
    "strict_validate",
    "subject_of",
    "subjects",
    "upgrade",
]
