"""The catalogue as a contract: every type registered, round-trips, strict, documented."""

from __future__ import annotations

import inspect
import re
from enum import StrEnum
from typing import Any

import pydantic
import pytest

import gpuop.events
from gpuop.events import (
    REGISTRY,
    Command,
    Event,
    MalformedMessage,
    Payload,
    bus_subject,
    decode,
    hardware,
    new_command,
    new_event,
    parse_as,
    strict_validate,
    subjects,
)
from gpuop.events.fields import DocumentedEnum, member_docs
from tests.support.event_samples import SAMPLES

CATALOGUE = [
    gpuop.events.hardware,
    gpuop.events.driver,
    gpuop.events.device,
    gpuop.events.network,
    gpuop.events.upgrade,
    gpuop.events.kube,
    gpuop.events.deadlines,
    gpuop.events.remediation_commands,
    gpuop.events.remediation,
    gpuop.events.mig_commands,
    gpuop.events.mig_requests,
    gpuop.events.mig,
    gpuop.events.dra,
    gpuop.events.device_api_commands,
    gpuop.events.device_api,
]
MODELS = [REGISTRY[type_] for type_ in sorted(REGISTRY)]
TOKEN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def _id(sample: Payload) -> str:
    return type(sample).TYPE


def _envelope(sample: Payload, node: str = "gpu-node-1.example.com") -> gpuop.events.Envelope:
    if isinstance(sample, Command):
        return new_command(sample, node=node, source="/gpuop/test", id="cmd-1")
    assert isinstance(sample, Event)
    return new_event(sample, node=node, source="/gpuop/test", correlationid="saga-1")


def _concrete_models(module: Any) -> set[type[Payload]]:
    return {
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Payload) and cls.__module__ == module.__name__ and not cls.ABSTRACT
    }


def test_importing_the_package_registers_every_catalogue_model() -> None:
    declared = set().union(*(_concrete_models(module) for module in CATALOGUE))
    assert declared == set(REGISTRY.values())


def test_every_registered_type_has_a_sample() -> None:
    sampled = {type(sample) for sample in SAMPLES}
    missing = sorted(cls.TYPE for cls in set(REGISTRY.values()) - sampled)
    assert not missing, f"add a sample to tests/support/event_samples.py for {missing}"


@pytest.mark.parametrize("cls", MODELS, ids=str)
def test_type_names_are_lowercase_and_dashed(cls: type[Payload]) -> None:
    if issubclass(cls, Command):
        tokens = [cls.SERVICE, cls.VERB]
        expected = f"io.gpuop.cmd.{cls.SERVICE}.{cls.VERB}.v{cls.VERSION}"
    else:
        assert issubclass(cls, Event)
        tokens = [cls.DOMAIN, cls.NAME]
        expected = f"io.gpuop.{cls.DOMAIN}.{cls.NAME}.v{cls.VERSION}"
    assert expected == cls.TYPE
    assert all(TOKEN.match(token) for token in tokens), tokens


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_every_type_round_trips_through_the_wire(sample: Payload) -> None:
    envelope = _envelope(sample)
    decoded_envelope, payload = decode(envelope.to_bytes())
    assert payload == sample
    assert type(payload) is type(sample)
    assert decoded_envelope == envelope
    assert parse_as(decoded_envelope, type(sample)) == sample
    assert strict_validate(type(sample), envelope.data) == sample


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_every_type_is_published_on_a_parseable_subject(sample: Payload) -> None:
    subject = subjects.parse_subject(bus_subject(_envelope(sample)))
    assert subject.node == "gpu-node-1.example.com"
    if isinstance(sample, Command):
        assert (subject.kind, subject.group) == (subjects.Kind.COMMAND, sample.SERVICE)
    else:
        assert isinstance(sample, Event)
        assert (subject.kind, subject.group) == (subjects.Kind.EVENT, sample.DOMAIN)


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_strict_validation_rejects_an_unknown_field_that_readers_ignore(sample: Payload) -> None:
    data = {**sample.model_dump(mode="json"), "surprise": 1}
    assert type(sample).model_validate(data) == sample
    with pytest.raises(MalformedMessage, match="surprise"):
        strict_validate(type(sample), data)


def _nested_records(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, value in data.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            found.append((name, value))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            found.append((name, value[0]))
    return found


NESTED = [s for s in SAMPLES if any(_nested_records(s.model_dump(mode="json")))]


@pytest.mark.parametrize("sample", NESTED, ids=_id)
def test_strict_validation_rejects_unknown_fields_in_nested_records(sample: Payload) -> None:
    for name, record in _nested_records(sample.model_dump(mode="json")):
        field = type(sample).model_fields[name]
        if "dict[" in str(field.annotation):
            continue  # maps such as labels have free keys
        record["surprise"] = 1
        data = sample.model_dump(mode="json")
        data[name] = [record] if isinstance(data[name], list) else record
        with pytest.raises(MalformedMessage, match="surprise"):
            strict_validate(type(sample), data)


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_payloads_are_frozen(sample: Payload) -> None:
    assert type(sample).model_config.get("frozen") is True
    for name in type(sample).model_fields:
        with pytest.raises(pydantic.ValidationError):
            setattr(sample, name, None)


def _undocumented(schema: dict[str, Any], where: str) -> list[str]:
    missing = []
    is_model_or_enum = schema.get("type") == "object" or "properties" in schema or "enum" in schema
    if is_model_or_enum and not schema.get("description"):
        missing.append(f"{where} (the model or enum itself)")
    for name, prop in schema.get("properties", {}).items():
        if not prop.get("description"):
            missing.append(f"{where}.{name}")
    return missing


@pytest.mark.parametrize("cls", MODELS, ids=str)
def test_every_field_of_every_model_has_a_description(cls: type[Payload]) -> None:
    schema = cls.model_json_schema()
    missing = _undocumented(schema, cls.__name__)
    for name, definition in schema.get("$defs", {}).items():
        missing += _undocumented(definition, name)
    assert not missing, f"write an attribute docstring for: {missing}"


def _documented_enums() -> list[type[StrEnum]]:
    enums = set()
    for module in CATALOGUE:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, DocumentedEnum) and cls is not DocumentedEnum:
                enums.add(cls)
    return sorted(enums, key=lambda e: e.__name__)


def test_enums_on_the_wire_are_documented_enums() -> None:
    wire_enums = set()
    for cls in REGISTRY.values():
        for definition in cls.model_json_schema().get("$defs", {}).values():
            if "enum" in definition:
                wire_enums.add(definition["title"])
    assert wire_enums <= {enum.__name__ for enum in _documented_enums()}


@pytest.mark.parametrize("enum", _documented_enums(), ids=lambda e: e.__name__)
def test_every_enum_member_has_a_one_line_docstring(enum: type[StrEnum]) -> None:
    docs = member_docs(enum)
    assert set(docs) == set(enum.__members__), f"undocumented: {set(enum.__members__) - set(docs)}"
    assert all(doc and "\n" not in doc for doc in docs.values())
    assert all(TOKEN.match(member.value) for member in enum)


def test_inventory_hash_is_a_digest_of_the_rest_of_the_inventory() -> None:
    inventory = next(s for s in SAMPLES if isinstance(s, hardware.HardwareDiscovered))
    assert inventory.inventory_hash == inventory.content_hash()
    rebooted = inventory.model_copy(update={"boot_id": "0b6c7d9e-1f2a-4b3c-8d4e-5f6a7b8c9d0e"})
    assert rebooted.content_hash() != inventory.content_hash()
    rehashed = inventory.model_copy(update={"inventory_hash": "b" * 64})
    assert rehashed.content_hash() == inventory.content_hash()


@pytest.mark.parametrize(
    ("cls", "data"),
    [
        (hardware.RescanHardware, {"reason": "x" * 5000}),
        (hardware.HardwareHeartbeat, {"boot_id": "not-a-boot-id"}),
        (gpuop.events.driver.LoadDriver, {"component": "gpu", "version": "1" * 65}),
        (gpuop.events.driver.LoadDriver, {"component": "tpu", "version": "1.0"}),
        (gpuop.events.device.PauseOperands, {"components": []}),
        (gpuop.events.kube.PodsObserved, {"gpu_pods": -1, "job_pods": 0, "drainable_pods": 0}),
        (
            gpuop.events.kube.NodeObserved,
            {"ready": True, "unschedulable": False, "labels": {f"k{i}": "v" for i in range(65)}},
        ),
    ],
    ids=["huge-text", "bad-boot-id", "huge-version", "unknown-enum", "empty", "negative", "many"],
)
def test_hostile_or_invalid_payloads_are_rejected(cls: type[Payload], data: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        cls.model_validate(data)
