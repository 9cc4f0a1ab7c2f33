"""Nothing goes on the wire larger than the server accepts (nats-server closes the connection
of a client that sends one): a publish over the limit is refused before it is sent, and a
dead letter keeps as much of its original as fits beside its headers."""

from __future__ import annotations

import pytest

from gpuop.bus import MessageTooLarge, publishing, streams
from tests.support.buses import heartbeat


def letter(data: bytes, max_payload: int) -> publishing.Outgoing:
    return publishing.dead_letter(
        "gpuop",
        subject="gpuop.evt.hardware.n1.heartbeat",
        data=data,
        consumer="discovery-labeler",
        seq=42,
        kind="malformed",
        reason="not JSON: é",
        max_payload=max_payload,
    )


def test_the_size_on_the_wire_counts_headers_as_nats_encodes_them() -> None:
    assert publishing.size_on_wire(b"xy", {}) == 2
    # NATS/1.0\r\n + "A: é\r\n" (é is two bytes) + \r\n
    assert publishing.size_on_wire(b"xy", {"A": "é"}) == 2 + 10 + 7 + 2


def test_a_message_over_the_limit_is_refused_with_its_headers_counted() -> None:
    out = publishing.raw("gpuop", "gpuop.evt.hardware.n1.heartbeat", b"x" * 100, {"A": "b"})
    assert publishing.fitting(out, 118) is out
    with pytest.raises(MessageTooLarge, match="118 bytes with headers, the server accepts 117"):
        publishing.fitting(out, 117)


def test_a_dead_letter_that_fits_keeps_its_original_whole() -> None:
    out = letter(b"x" * 100, publishing.DEFAULT_MAX_PAYLOAD)
    assert out.data == b"x" * 100 and streams.DLQ_TRUNCATED not in out.headers


def test_a_dead_letter_of_an_original_at_the_limit_is_cut_to_fit() -> None:
    original = b"y" * 4000
    out = letter(original, 4000)
    assert publishing.size_on_wire(out.data, out.headers) == 4000
    assert original.startswith(out.data) and len(out.data) > 3000
    assert out.headers[streams.DLQ_TRUNCATED] == "4000"
    assert out.headers[streams.DLQ_SEQ] == "42"


def test_a_dead_letter_of_a_message_under_a_very_long_subject_gets_a_shorter_one() -> None:
    original = "gpuop.evt.driver." + "x" * 4000 + ".loaded"
    out = publishing.dead_letter(
        "gpuop", subject=original, data=b"{", consumer="c", seq=1, kind="malformed", reason="r"
    )
    # every token kept, so the consumer's permission (deploy/nats) still covers it
    assert out.subject == "gpuop.dlq.gpuop.evt.driver." + "x" * publishing.MAX_TOKEN + ".loaded"
    assert streams.subject_matches("gpuop.dlq.gpuop.evt.driver.*.*", out.subject)
    assert out.headers[streams.DLQ_SUBJECT] == original
    with pytest.raises(MessageTooLarge, match="subject over"):
        publishing.fitting(publishing.raw("gpuop", original, b"{", None), 1 << 20)


def test_a_subject_of_too_many_tokens_is_cut_short() -> None:
    original = "gpuop.evt" + ".a" * 3000
    out = publishing.dead_letter(
        "gpuop", subject=original, data=b"{", consumer="c", seq=1, kind="malformed", reason="r"
    )
    assert len(out.subject) <= publishing.MAX_SUBJECT and not out.subject.endswith(".")
    assert f"gpuop.dlq.{original}".startswith(out.subject)


def test_message_ids_are_keyed_by_the_publishers_credential() -> None:
    envelope = heartbeat("gpu-1", 1)
    plain = publishing.prepare(envelope, "gpuop")
    assert plain.headers["Nats-Msg-Id"] == envelope.id  # no credential: the id itself
    driver = publishing.id_key(["tls://driver-manager:s3cret@nats:4222"])
    again = publishing.id_key(["tls://driver-manager:s3cret@other:4222", "tls://x"])
    squatter = publishing.id_key(["tls://discovery:other@nats:4222"])
    assert driver == again and driver != squatter and len(driver) == 32
    keyed = publishing.prepare(envelope, "gpuop", driver).headers["Nats-Msg-Id"]
    assert keyed == publishing.prepare(envelope, "gpuop", driver).headers["Nats-Msg-Id"]
    assert keyed not in (
        envelope.id,
        publishing.prepare(envelope, "gpuop", squatter).headers["Nats-Msg-Id"],
    )
    assert publishing.id_key(["nats://127.0.0.1:4222"]) == b""
    assert publishing.id_key([], b"-----BEGIN NATS USER JWT-----") != b""


def test_a_dead_letters_id_is_the_same_for_every_try_and_keyed_by_the_publisher() -> None:
    def dead(key: bytes, seq: int = 42) -> str:
        out = publishing.dead_letter(
            "gpuop",
            subject="gpuop.cmd.driver-manager.n1.install",
            data=b"{}",
            consumer="driver-manager-n1",
            seq=seq,
            kind="malformed",
            reason="x",
            key=key,
        )
        return out.headers["Nats-Msg-Id"]

    manager = publishing.id_key(["nats://driver-manager:secret@nats:4222"])
    squatter = publishing.id_key(["nats://discovery:other@nats:4222"])
    assert dead(b"") == "dlq:driver-manager-n1:42"  # no credential: as it always was
    assert dead(manager) == dead(manager) != dead(manager, seq=43)
    assert dead(manager) != dead(squatter)
    assert "driver-manager-n1" not in dead(manager)
