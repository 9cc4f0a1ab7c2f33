"""Decoding tells malformed input (dead-letter it) from a newer type (ack and count it)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuop.events import (
    MalformedMessage,
    UnknownEventType,
    bus_subject,
    decode,
    driver,
    ids,
    new_command,
    new_event,
    parse_as,
    subjects,
)
from gpuop.events.envelope import REGISTRY, Command, Event, StateChangedEvent

NOW = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
LOADED = driver.DriverLoaded(command_id="c1", component=driver.Component.GPU, version="580.1")


def _document(**changes: Any) -> dict[str, Any]:
    envelope = new_event(LOADED, node="n1", source="/gpuop/test", id="e1", now=NOW)
    document: dict[str, Any] = json.loads(envelope.to_bytes())
    document.update(changes)
    return document


def _raw(document: Any) -> bytes:
    return json.dumps(document).encode()


def test_a_valid_message_decodes_to_its_envelope_and_typed_payload() -> None:
    envelope, payload = decode(_raw(_document()))
    assert payload == LOADED
    assert envelope.id == "e1"
    assert envelope.node == "n1"
    assert envelope.time == NOW
    assert bus_subject(envelope) == "gpuop.evt.driver.n1.loaded"


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"\xff\xfe", b"", b"[" * 100_000 + b"]" * 100_000],
    ids=["broken", "not-utf8", "empty", "deeply-nested"],
)
def test_bytes_that_are_not_json_are_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode(raw)


@pytest.mark.parametrize("document", [[], "text", 42, None], ids=["list", "str", "int", "null"])
def test_json_that_is_not_an_object_is_malformed(document: Any) -> None:
    with pytest.raises(MalformedMessage, match="not a JSON object"):
        decode(_raw(document))


@pytest.mark.parametrize("field", ["id", "source", "type", "subject", "time", "data"])
def test_an_envelope_missing_a_required_attribute_is_malformed(field: str) -> None:
    document = _document()
    del document[field]
    with pytest.raises(MalformedMessage, match="invalid envelope"):
        decode(_raw(document))


@pytest.mark.parametrize(
    "changes",
    [
        {"id": "x" * 129},
        {"source": "s" * 513},
        {"subject": "n" * 254},
        {"correlationid": "c" * 257},
        {"traceparent": "t" * 129},
        {"specversion": "0.3"},
        {"time": "yesterday"},
        {"data": [1, 2]},
    ],
    ids=["id", "source", "subject", "correlationid", "traceparent", "spec", "time", "data"],
)
def test_oversize_or_invalid_envelope_attributes_are_malformed(changes: dict[str, Any]) -> None:
    with pytest.raises(MalformedMessage, match="invalid envelope"):
        decode(_raw(_document(**changes)))


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"command_id": "c1", "component": "gpu", "version": "9" * 100_000},
        {"command_id": "c1", "component": "gpu", "version": "580.1", "modules": ["m"] * 65},
        {"command_id": "c1", "component": "tpu", "version": "580.1"},
    ],
    ids=["empty", "oversize-version", "too-many-modules", "unknown-component"],
)
def test_data_that_does_not_fit_its_type_is_malformed(data: dict[str, Any]) -> None:
    with pytest.raises(MalformedMessage, match=r"invalid io\.gpuop\.driver\.loaded\.v1 data"):
        decode(_raw(_document(data=data)))


def test_malformed_reasons_stay_short_even_for_many_errors() -> None:
    data = {"command_id": "c1", "component": "gpu", "version": "1", "modules": ["b@d"] * 64}
    with pytest.raises(MalformedMessage) as caught:
        decode(_raw(_document(data=data)))
    assert "+61 more" in str(caught.value)
    assert len(str(caught.value)) < 500


@pytest.mark.parametrize("type_", ["io.gpuop.driver.loaded.v9", "io.gpuop.quantum.entangled.v1"])
def test_a_well_formed_envelope_of_an_unknown_type_is_unknown_not_malformed(type_: str) -> None:
    with pytest.raises(UnknownEventType) as caught:
        decode(_raw(_document(type=type_)))
    assert caught.value.type == type_
    assert not isinstance(caught.value, MalformedMessage)


def test_readers_ignore_unknown_envelope_attributes_and_payload_fields() -> None:
    document = _document(newextension="x")
    document["data"]["added_in_v1_1"] = True
    _, payload = decode(_raw(document))
    assert payload == LOADED


def test_parse_as_checks_the_type() -> None:
    envelope, _ = decode(_raw(_document()))
    assert parse_as(envelope, driver.DriverLoaded) == LOADED
    with pytest.raises(MalformedMessage, match="expected"):
        parse_as(envelope, driver.DriverUnloaded)


def test_command_id_is_deterministic_per_saga_step_and_attempt() -> None:
    first = ids.step("saga/n1/1", "driver-reload-required/unload", 1)
    assert first == ids.step("saga/n1/1", "driver-reload-required/unload", 1)
    others = {
        ids.step("saga/n2/1", "driver-reload-required/unload", 1),
        ids.step("saga/n1/1", "driver-reload-required/load", 1),
        ids.step("saga/n1/1", "driver-reload-required/unload", 2),
    }
    assert first not in others
    assert len(others) == 3
    assert re.fullmatch(r"[0-9a-f]{32}", first)


def test_a_reissued_command_is_byte_identical_apart_from_its_time() -> None:
    unload = driver.UnloadDriver(component=driver.Component.GPU)
    id_ = ids.step("saga/n1/1", "unload", 1)
    first = new_command(unload, node="n1", source="/gpuop/upgrade-orchestrator", id=id_, now=NOW)
    again = new_command(unload, node="n1", source="/gpuop/upgrade-orchestrator", id=id_, now=NOW)
    assert first.to_bytes() == again.to_bytes()
    assert bus_subject(first) == "gpuop.cmd.driver-manager.n1.unload"


def test_events_get_fresh_ids_and_the_current_time() -> None:
    first = new_event(LOADED, node="n1", source="/gpuop/driver-manager/n1")
    second = new_event(LOADED, node="n1", source="/gpuop/driver-manager/n1")
    assert first.id != second.id
    assert first.time.tzinfo is not None


def test_envelopes_refuse_invalid_nodes_and_abstract_payloads() -> None:
    with pytest.raises(subjects.InvalidSubject):
        new_event(LOADED, node="Not_A_Node", source="/gpuop/test")
    with pytest.raises(TypeError, match="abstract"):
        new_event(
            driver.DriverResult(command_id="c1", component=driver.Component.GPU),
            node="n1",
            source="/t",
        )


def test_an_event_caused_by_a_message_carries_its_id_and_correlation() -> None:
    command = new_command(
        driver.LoadDriver(component=driver.Component.GPU, version="580.159.04"),
        node="gpu-1",
        source="/test",
        id="cmd-1",
        correlationid="saga-1",
    )
    loaded = driver.DriverLoaded(
        command_id="cmd-1", component=driver.Component.GPU, version="580.159.04"
    )

    answer = new_event(loaded, node="gpu-1", source="/test", cause=command)
    told = new_event(loaded, node="gpu-1", source="/test", cause=command, correlationid="other")

    assert (answer.causationid, answer.correlationid) == ("cmd-1", "saga-1")
    assert (told.causationid, told.correlationid) == ("cmd-1", "other")


STATE_CHANGES = [cls for cls in REGISTRY.values() if issubclass(cls, StateChangedEvent)]


def test_every_saga_kind_publishes_its_state_changes_on_the_state_subject() -> None:
    from gpuop.saga.registry import KINDS

    assert {cls.DOMAIN for cls in STATE_CHANGES} == {kind.state_change.DOMAIN for kind in KINDS}
    assert {cls.DOMAIN for cls in STATE_CHANGES} >= {"upgrade", "remediation", "mig", "device-api"}


@pytest.mark.parametrize("cls", STATE_CHANGES, ids=lambda cls: cls.__name__)
def test_a_state_change_routes_on_each_state_and_refuses_a_bogus_one(
    cls: type[StateChangedEvent],
) -> None:
    states: Any = cls.model_fields[cls.SUBJECT_FIELD].annotation
    for state in states:
        assert cls.subject_token_of({cls.SUBJECT_FIELD: state.value}) == state.value
    for data in ({}, {cls.SUBJECT_FIELD: "bogus"}, {cls.SUBJECT_FIELD: 3}):
        with pytest.raises(MalformedMessage, match=cls.SUBJECT_FIELD):
            cls.subject_token_of(data)


def test_an_abstract_payload_has_no_subject_token() -> None:
    with pytest.raises(TypeError, match="not a concrete payload"):
        Event.fixed_subject_token()
    with pytest.raises(TypeError, match="not a concrete payload"):
        Command.subject_token_of({})


def test_commands_and_events_are_typed_from_their_group_and_token() -> None:
    assert driver.DriverLoaded.TYPE == "io.gpuop.driver.loaded.v1"
    assert LOADED.subject_token() == driver.DriverLoaded.subject_token_of({}) == "loaded"
    unload = driver.UnloadDriver
    assert unload.TYPE == "io.gpuop.cmd.driver-manager.unload.v1"
    assert unload.subject_token_of({}) == "unload"
