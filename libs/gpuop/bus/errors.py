"""Every error the bus raises or understands, mapped in one place.

    BusError                    something went wrong talking to the bus
    ├── PublishTimeout          the server did not confirm a publish in time (safe to retry:
    │                           the event id dedupes it)
    ├── IdTaken                 a first publish answered "duplicate": another publisher
    │                           stored the message id first, and this message was dropped
    ├── BusUnavailable          not connected, and did not reconnect in time
    ├── MessageTooLarge         data and headers over the server's payload limit, or a
    │                           subject too long: refused before sending (the server would
    │                           close the connection)
    ├── RevisionConflict        a KV write based on a stale revision
    │   └── KeyExists           create-if-absent found the key present
    └── BucketMissing           a KV bucket that `start()` did not create

    HandlerError                raised by message handlers to steer the ack
    ├── TemporaryError          try again later: nak with `delay`
    └── PermanentError          retrying is useless: terminate and dead-letter

Raw `nats` exceptions never leave `gpuop.bus`; service code catches these.
"""

from __future__ import annotations


class BusError(Exception):
    """A failure of the bus itself, not of the message being handled."""


class PublishTimeout(BusError):
    """The server did not acknowledge a publish within the timeout."""


class IdTaken(BusError):
    """The first try of a publish was answered as a duplicate: the server already held a
    message with this `Nats-Msg-Id`, which this publisher did not store (a retry's duplicate
    is the earlier try, and a success). Someone stored the id first, and the message was not
    stored: an alarm, never a success."""

    def __init__(self, subject: str, msg_id: str, seq: int) -> None:
        super().__init__(
            f"publish to {subject} dropped as a duplicate on its first try: message id "
            f"{msg_id} was already stored (sequence {seq}) by another publisher"
        )
        self.subject = subject
        self.msg_id = msg_id
        self.seq = seq


class BusUnavailable(BusError):
    """No connection to the server."""


class PlacementPending(BusUnavailable):
    """JetStream found too few servers for a stream's replicas (its error 10005, "no
    suitable peers for placement"): on a cluster that has just started, its meta leader may
    not yet see every member online; `start` asks again until its deadline."""


PLACEMENT_ERROR = 10005
"""JetStream's error code for "no suitable peers for placement"."""


class MessageTooLarge(BusError):
    """A message whose data and headers exceed the server's `max_payload`, or whose subject
    is longer than `publishing.MAX_SUBJECT`; never sent, since nats-server answers one by
    closing the connection."""


class RevisionConflict(BusError):
    """A compare-and-set write whose expected revision is no longer the latest."""

    def __init__(self, key: str, expected: int | None, message: str = "") -> None:
        detail = message or f"key {key!r} is not at revision {expected}"
        super().__init__(detail)
        self.key = key
        self.expected = expected


class KeyExists(RevisionConflict):
    """`create` found the key already present."""

    def __init__(self, key: str) -> None:
        super().__init__(key, None, f"key {key!r} already exists")


class BucketMissing(BusError):
    """A KV bucket that does not exist."""


class HandlerError(Exception):
    """Base of the errors a handler raises to decide what happens to its message."""


class TemporaryError(HandlerError):
    """The message may succeed later: it is redelivered after `delay` seconds."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(HandlerError):
    """The message can never succeed: it is terminated and dead-lettered with this reason."""
