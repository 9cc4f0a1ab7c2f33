"""The envelope every message on the bus wears, and the registry of payload types.

A message is one JSON document: the CloudEvents 1.0 attributes, gpuop's extensions
(`correlationid`, `causationid`, `traceparent`) and `data`, the payload. Payload models
subclass `Event` or `Command`; subclassing registers them, so `decode` can turn raw bytes
into a typed payload and tell a malformed message (dead-letter it) from a message of a type
this version does not know (a newer producer: ack it and count it).

Producers call `new_event` / `new_command`; the bus calls `bus_subject` and `decode`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from gpuop.events import documents, subjects
from gpuop.events.fields import WIRE_MODEL

SPEC_VERSION: Final = "1.0"
TYPE_PREFIX = "io.gpuop"


class MalformedMessage(ValueError):
    """The bytes are not a valid envelope, or its data does not fit its declared type."""


class UnknownEventType(LookupError):
    """A well-formed envelope whose type this version does not know (a newer producer)."""

    def __init__(self, type_: str) -> None:
        super().__init__(f"unknown message type {type_!r}")
        self.type = type_


class Payload(BaseModel):
    """Base of every event and command payload: frozen, tolerant of unknown fields."""

    model_config = WIRE_MODEL

    TYPE: ClassVar[str] = ""
    """CloudEvents `type`, set for each concrete subclass from its class variables."""
    VERSION: ClassVar[int] = 1
    """Schema version; a breaking change adds a new model with the next version."""
    ABSTRACT: ClassVar[bool] = True
    TOKEN_VARIABLE: ClassVar[str] = ""
    """The class variable that names a concrete payload and is the last token of its subject
    (`NAME` for an event, `VERB` for a command): a subclass that declares it is registered."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.TOKEN_VARIABLE and cls.TOKEN_VARIABLE in cls.__dict__:
            cls.ABSTRACT = False
            cls.TYPE = (
                f"{TYPE_PREFIX}.{cls.type_group()}.{cls.fixed_subject_token()}.v{cls.VERSION}"
            )
            _register(cls)

    @classmethod
    def type_group(cls) -> str:
        """The middle of the CloudEvents type: the event's domain, `cmd.` and the service."""
        raise TypeError(f"{cls.__name__} is neither an event nor a command")

    @classmethod
    def fixed_subject_token(cls) -> str:
        """The value of `TOKEN_VARIABLE`: the event's `NAME`, the command's `VERB`."""
        if cls.ABSTRACT:
            raise TypeError(f"{cls.__name__} is not a concrete payload")
        return str(getattr(cls, cls.TOKEN_VARIABLE))

    def subject_token(self) -> str:
        """Last token of the bus subject; events named after a state override it."""
        return self.fixed_subject_token()

    @classmethod
    def subject_token_of(cls, data: dict[str, Any]) -> str:
        """`subject_token` without building the model, for routing already-encoded data."""
        if cls.subject_token is Payload.subject_token:
            return cls.fixed_subject_token()
        return cls.model_validate(data).subject_token()


PayloadT = TypeVar("PayloadT", bound=Payload)

REGISTRY: dict[str, type[Payload]] = {}
"""Every concrete payload model by its CloudEvents type."""


def _register(cls: type[Payload]) -> None:
    if cls.TYPE in REGISTRY and REGISTRY[cls.TYPE] is not cls:
        raise TypeError(f"{cls.TYPE} is declared twice: {REGISTRY[cls.TYPE]} and {cls}")
    REGISTRY[cls.TYPE] = cls


class Event(Payload):
    """A fact about a node (or the cluster), in the past tense."""

    TOKEN_VARIABLE: ClassVar[str] = "NAME"
    DOMAIN: ClassVar[str]
    """Subject group: `hardware`, `driver`, `device`, `network`, `upgrade`, `kube`, `saga`."""
    NAME: ClassVar[str]
    """Last subject token and middle of the type: `loaded` -> `io.gpuop.driver.loaded.v1`."""

    @classmethod
    def type_group(cls) -> str:
        return cls.DOMAIN


class StateChangedEvent(Event):
    """A saga's move to a new state, published on the subject of that state (its
    `SUBJECT_FIELD`) instead of its `NAME`, so a subscriber can filter on the state."""

    SUBJECT_FIELD: ClassVar[str] = "to_state"
    """The field whose value is the subject's last token instead of `NAME`."""
    SUBJECT_PARAMETER: ClassVar[str] = "state"
    """Name of that token in the AsyncAPI channel address."""

    def subject_token(self) -> str:
        return str(getattr(self, self.SUBJECT_FIELD).value)

    @classmethod
    def subject_token_of(cls, data: dict[str, Any]) -> str:
        states: Any = cls.model_fields[cls.SUBJECT_FIELD].annotation
        try:
            return str(states(data[cls.SUBJECT_FIELD]).value)
        except (KeyError, TypeError, ValueError):
            raise MalformedMessage(f"{cls.TYPE} data has no valid {cls.SUBJECT_FIELD}") from None


def event_names(domain: str) -> tuple[str, ...]:
    """Every last subject token an event of `domain` may travel on, from the registry: each
    event's `NAME`, and for a `StateChangedEvent` every value of its `SUBJECT_FIELD`. The
    NATS grants of the services publishing a domain are these exact names, never `*`, so a
    credential cannot make up subjects (each of which the event log would keep)."""
    names: set[str] = set()
    for cls in REGISTRY.values():
        if not issubclass(cls, Event) or domain != cls.DOMAIN:
            continue
        if issubclass(cls, StateChangedEvent):
            states: Any = cls.model_fields[cls.SUBJECT_FIELD].annotation
            names.update(str(state.value) for state in states)
        else:
            names.add(cls.fixed_subject_token())
    if not names:
        raise ValueError(f"no event of domain {domain!r} is registered")
    return tuple(sorted(names))


class Command(Payload):
    """An order to one node agent; its id is deterministic so re-issuing it is a no-op."""

    TOKEN_VARIABLE: ClassVar[str] = "VERB"
    SERVICE: ClassVar[str]
    """The service that executes it: the subject group."""
    VERB: ClassVar[str]
    """Last subject token: `unload` -> `gpuop.cmd.driver-manager.<node>.unload`."""

    @classmethod
    def type_group(cls) -> str:
        return f"cmd.{cls.SERVICE}"


class Envelope(BaseModel):
    """CloudEvents 1.0 attributes plus gpuop's extensions around one payload."""

    model_config = WIRE_MODEL

    specversion: Literal["1.0"] = SPEC_VERSION
    """CloudEvents specification version."""
    id: str = Field(min_length=1, max_length=128)
    """Unique id; the `Nats-Msg-Id` is made from it (keyed by the publisher's credential, so
    no other publisher can take it first), so a retried publish is dropped as a duplicate."""
    source: str = Field(min_length=1, max_length=512)
    """Producer, as a URI reference: `/gpuop/<service>/<node>`."""
    type: str = Field(min_length=1, max_length=256)
    """Payload type with its version: `io.gpuop.driver.loaded.v1`."""
    subject: str = Field(min_length=1, max_length=253)
    """The node the message is about (`_cluster` for cluster-wide ones)."""
    time: datetime
    """When the producer created the message (UTC)."""
    datacontenttype: Literal["application/json"] = "application/json"
    """Always JSON."""
    correlationid: str | None = Field(default=None, max_length=256)
    """The saga or rollout this message belongs to."""
    causationid: str | None = Field(default=None, max_length=128)
    """Id of the command or event that caused this one."""
    traceparent: str | None = Field(default=None, max_length=128)
    """W3C trace context, so one trace spans every service that handled the upgrade."""
    data: dict[str, Any]
    """The payload, as described by the schema of `type`."""

    def to_bytes(self) -> bytes:
        """Encode as compact JSON, the only wire format."""
        return self.model_dump_json(exclude_none=True).encode()

    @property
    def node(self) -> str:
        """The node this message is about."""
        return self.subject


def _envelope(
    payload: Payload,
    *,
    node: str,
    source: str,
    id: str | None,
    correlationid: str | None,
    causationid: str | None,
    traceparent: str | None,
    now: datetime | None,
) -> Envelope:
    subjects.encode_node(node)
    if payload.ABSTRACT:
        raise TypeError(f"{type(payload).__name__} is abstract and cannot be sent")
    return Envelope(
        id=id or uuid.uuid4().hex,
        source=source,
        type=payload.TYPE,
        subject=node,
        time=now or datetime.now(UTC),
        correlationid=correlationid,
        causationid=causationid,
        traceparent=traceparent,
        data=payload.model_dump(mode="json"),
    )


def new_event(
    payload: Event,
    *,
    node: str,
    source: str,
    id: str | None = None,
    correlationid: str | None = None,
    causationid: str | None = None,
    traceparent: str | None = None,
    now: datetime | None = None,
    cause: Envelope | None = None,
) -> Envelope:
    """Wrap an event payload; `node` is the node it is about, or `subjects.CLUSTER`.

    `cause` is the message this event answers (a command, an event reacted to): its id is
    the causation id and its correlation id is carried on, unless they are given.
    """
    if cause is not None:
        causationid = causationid or cause.id
        correlationid = correlationid or cause.correlationid
    return _envelope(
        payload,
        node=node,
        source=source,
        id=id,
        correlationid=correlationid,
        causationid=causationid,
        traceparent=traceparent,
        now=now,
    )


def new_command(
    payload: Command,
    *,
    node: str,
    source: str,
    id: str,
    correlationid: str | None = None,
    causationid: str | None = None,
    traceparent: str | None = None,
    now: datetime | None = None,
) -> Envelope:
    """Wrap a command for the agent on `node`; `id` should come from `gpuop.events.ids`."""
    return _envelope(
        payload,
        node=node,
        source=source,
        id=id,
        correlationid=correlationid,
        causationid=causationid,
        traceparent=traceparent,
        now=now,
    )


def payload_class(type_: str) -> type[Payload]:
    """The model registered for `type_`; raises `UnknownEventType`."""
    try:
        return REGISTRY[type_]
    except KeyError:
        raise UnknownEventType(type_) from None


def bus_subject(envelope: Envelope, *, prefix: str = subjects.DEFAULT_PREFIX) -> str:
    """The subject `envelope` is published on, derived from its type and node."""
    cls = payload_class(envelope.type)
    token = cls.subject_token_of(envelope.data)
    if issubclass(cls, Command):
        return subjects.command_subject(cls.SERVICE, envelope.subject, token, prefix=prefix)
    assert issubclass(cls, Event)
    return subjects.event_subject(cls.DOMAIN, envelope.subject, token, prefix=prefix)


def subject_of(envelope: Envelope, payload: Payload, *, prefix: str) -> str:
    """The one subject a decoded message of its type about its node may travel on, as its
    schema declares it (`x-gpuop-subject`): `bus_subject` without decoding the data again."""
    cls = type(payload)
    token = payload.subject_token()
    if issubclass(cls, Command):
        return subjects.command_subject(cls.SERVICE, envelope.subject, token, prefix=prefix)
    assert issubclass(cls, Event)
    return subjects.event_subject(cls.DOMAIN, envelope.subject, token, prefix=prefix)


class SubjectMismatch(MalformedMessage):
    """A message on another subject than the one its type and node declare."""


def check_subject(subject: str, envelope: Envelope, payload: Payload) -> None:
    """A message must travel on the subject its type and node declare (`x-gpuop-subject`);
    `SubjectMismatch` otherwise. NATS permissions say who may publish on which subjects, so
    the subject is what ties a type to its publisher: a `NodeAdmitted` that a node agent put
    on its own hardware subject, or a message about one node on another's, is forged or
    corrupt, and believing it would let any credential steer the fleet. Every reader checks
    it: the dispatcher (a dead letter), and the readers of stored messages through
    `decode_on` (telemetry's cluster exporter, `gpuop events export`, `gpuop replay`)."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[1] not in (subjects.Kind.EVENT, subjects.Kind.COMMAND):
        return  # not a gpuop event or command subject (a test's own): nothing declares it
    try:
        expected = subject_of(envelope, payload, prefix=parts[0])
    except subjects.InvalidSubject as exc:
        raise SubjectMismatch(str(exc)) from None
    if subject != expected:
        raise SubjectMismatch(f"a {envelope.type} about {envelope.subject!r} travels on "
                              f"{expected}, not {subject}")  # fmt: skip


def decode_on(subject: str, raw: bytes) -> tuple[Envelope, Payload]:
    """`decode` the message `raw` stored on `subject`, then `check_subject`: how every
    reader believes a message. `SubjectMismatch` (a `MalformedMessage`) for one on a subject
    its type and node do not declare."""
    envelope, payload = decode(raw)
    check_subject(subject, envelope, payload)
    return envelope, payload


def decode(raw: bytes) -> tuple[Envelope, Payload]:
    """Bytes -> envelope and typed payload.

    Raises `MalformedMessage` for anything that is not a valid envelope with valid data, and
    `UnknownEventType` for a valid envelope of a type this version does not know.
    """
    try:
        document = documents.json_object(raw)
    except ValueError as exc:
        raise MalformedMessage(str(exc)) from None
    try:
        envelope = Envelope.model_validate(document)
    except ValidationError as exc:
        raise MalformedMessage(f"invalid envelope: {_summary(exc)}") from None
    cls = payload_class(envelope.type)
    try:
        payload = cls.model_validate(envelope.data)
    except ValidationError as exc:
        raise MalformedMessage(f"invalid {envelope.type} data: {_summary(exc)}") from None
    return envelope, payload


def parse_as(envelope: Envelope, cls: type[PayloadT]) -> PayloadT:
    """Validate `envelope.data` as `cls`, checking that the type matches."""
    if envelope.type != cls.TYPE:
        raise MalformedMessage(f"expected {cls.TYPE}, got {envelope.type}")
    try:
        return cls.model_validate(envelope.data)
    except ValidationError as exc:
        raise MalformedMessage(f"invalid {envelope.type} data: {_summary(exc)}") from None


def _summary(exc: ValidationError) -> str:
    """First few validation errors as one short line (error text must stay bounded)."""
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"]) or "<root>"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def strict_validate(cls: type[PayloadT], data: dict[str, Any]) -> PayloadT:
    """Validate like a contract test: unknown fields anywhere are an error, not ignored."""
    model = cls.model_validate(data)
    _reject_unknown(model, data, cls.__name__)
    return model


def _reject_unknown(model: BaseModel, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        return
    fields = type(model).model_fields
    aliases = {f.alias or name for name, f in fields.items()} | set(fields)
    unknown = set(data) - aliases
    if unknown:
        raise MalformedMessage(f"{where}: unknown fields {sorted(unknown)}")
    for name in fields:
        value = getattr(model, name)
        raw = data.get(name)
        if isinstance(value, BaseModel):
            _reject_unknown(value, raw, f"{where}.{name}")
        elif isinstance(value, list | tuple) and isinstance(raw, list):
            for i, (item, raw_item) in enumerate(zip(value, raw, strict=False)):
                if isinstance(item, BaseModel):
                    _reject_unknown(item, raw_item, f"{where}.{name}[{i}]")
