"""minisign keys and signatures: minisign's own vectors verify, and what gpuop writes has
minisign's layout, so either tool checks the other's files."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from gpuop.host import packaging, signing

# jedisct1's key and signatures of the 4 bytes b"test", from the minisign-verify crate's
# documentation: a legacy ("Ed") one and a prehashed ("ED") one
MINISIGN_KEY = "RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3"
LEGACY_SIGNATURE = (
    b"untrusted comment: signature from minisign secret key\n"
    b"RWQf6LRCGA9i59SLOFxz6NxvASXDJeRtuZykwQepbDEGt87ig1BNpWaVWuNrm73YiIiJbq71Wi+dP9eKL8OC351v"
    b"wIasSSbXxwA=\n"
    b"trusted comment: timestamp:1555779966\tfile:test\n"
    b"QtKMXWyYcwdpZAlPF7tE2ENJkRd1ujvKjlj1m9RtHTBnZPa5WKU5uWRs5GoP5M/VqE81QFuMKI5k/SfNQUaOAA==\n"
)
PREHASHED_SIGNATURE = (
    b"untrusted comment: signature from minisign secret key\n"
    b"RUQf6LRCGA9i559r3g7V1qNyJDApGip8MfqcadIgT9CuhV3EMhHoN1mGTkUidF/z7SrlQgXdy8ofjb7bNJJylDOo"
    b"crCo8KLzZwo=\n"
    b"trusted comment: timestamp:1633700835\tfile:test\tprehashed\n"
    b"wLMDjy9FLAuxZ3q4NlEvkgtyhrr0gtTu6KC4KBJdITbbOeAi1zBIYo0v4iTgt8jJpIidRJnp94ABQkJAgAooBQ==\n"
)


@pytest.mark.parametrize(
    ("text", "algorithm"), [(LEGACY_SIGNATURE, b"Ed"), (PREHASHED_SIGNATURE, b"ED")]
)
def test_minisigns_own_signatures_verify(text: bytes, algorithm: bytes) -> None:
    key = signing.PublicKey.from_base64(MINISIGN_KEY)
    assert key.key_id_hex == "E7620F1842B4E81F"
    signature = signing.Signature.parse(text)
    assert signature.algorithm == algorithm
    assert signing.verify(b"test", signature, [key]) == key
    with pytest.raises(signing.SignatureError, match="does not verify"):
        signing.verify(b"tesT", signature, [key])


def test_a_signature_has_minisigns_four_line_layout() -> None:
    key = signing.SecretKey.generate()
    comment = "timestamp:1700000000\tfile:index.json\thashed"
    text = signing.sign(b'{"packages": []}\n', key, comment).file_text()
    untrusted, packed, trusted, global_signature, end = text.split("\n")
    assert untrusted == "untrusted comment: signature from minisign secret key"
    body = base64.b64decode(packed)
    assert len(body) == 74 and body[:2] == b"ED" and body[2:10] == key.key_id
    assert trusted == f"trusted comment: {comment}"
    assert len(base64.b64decode(global_signature)) == 64 and end == ""
    parsed = signing.Signature.parse(text.encode())
    assert parsed.trusted_comment == comment
    assert signing.verify(b'{"packages": []}\n', parsed, [key.public_key]) == key.public_key


def test_the_global_signature_covers_the_trusted_comment() -> None:
    key = signing.SecretKey.generate()
    signed = signing.sign(b"data", key, "timestamp:1\tfile:index.json\thashed")
    forged = signing.Signature.parse(
        signed.file_text().replace("timestamp:1", "timestamp:2").encode()
    )
    with pytest.raises(signing.SignatureError, match="trusted comment"):
        signing.verify(b"data", forged, [key.public_key])


def test_only_a_listed_key_verifies() -> None:
    key, other = signing.SecretKey.generate(), signing.SecretKey.generate()
    signed = signing.sign(b"data", key, "c")
    with pytest.raises(signing.SignatureError, match="not a trusted key"):
        signing.verify(b"data", signed, [other.public_key])
    assert signing.verify(b"data", signed, [other.public_key, key.public_key]) == key.public_key
    legacy = signing.sign(b"data", key, "c", legacy=True)
    assert legacy.algorithm == b"Ed"
    assert signing.verify(b"data", legacy, [key.public_key]) == key.public_key


def test_key_files_are_minisigns(tmp_path: Path) -> None:
    key = packaging.write_key_pair(tmp_path / "minisign.key", tmp_path / "minisign.pub")
    assert (tmp_path / "minisign.key").stat().st_mode & 0o777 == 0o600
    public = (tmp_path / "minisign.pub").read_text()
    comment, line, _ = public.split("\n")
    assert comment == f"untrusted comment: minisign public key {key.public_key.key_id_hex}"
    assert line.startswith("RW") and len(line) == 56
    assert signing.PublicKey.from_file_text(public) == key.public_key
    secret = (tmp_path / "minisign.key").read_text()
    body = base64.b64decode(secret.split("\n")[1])
    # "Ed", no KDF, "B2", then salt and limits zeroed: what `minisign -G -W` writes
    assert len(body) == 158 and body[:6] == b"Ed\0\0B2" and body[6:54] == bytes(48)
    assert signing.SecretKey.from_file_text(secret) == key
    with pytest.raises(FileExistsError):
        packaging.write_key_pair(tmp_path / "minisign.key", tmp_path / "other.pub")


def test_a_password_protected_or_damaged_secret_key_is_refused() -> None:
    text = signing.SecretKey.generate().file_text()
    comment, line, _ = text.split("\n")
    body = bytearray(base64.b64decode(line))
    encrypted = body[:2] + b"Sc" + body[4:]
    with pytest.raises(signing.SignatureError, match="minisign -C -W"):
        signing.SecretKey.from_file_text(f"{comment}\n{base64.b64encode(encrypted).decode()}\n")
    body[70] ^= 1
    with pytest.raises(signing.SignatureError, match="checksum"):
        signing.SecretKey.from_file_text(f"{comment}\n{base64.b64encode(body).decode()}\n")


@pytest.mark.parametrize(
    "text",
    [
        b"untrusted comment: x\nnot base64!\ntrusted comment: y\nAAAA\n",
        b"untrusted comment: x\n" + base64.b64encode(b"XX" + bytes(72)) + b"\ntrusted comment: y\n"
        b"" + base64.b64encode(bytes(64)) + b"\n",
        b"comment: x\n" + base64.b64encode(b"ED" + bytes(72)) + b"\ntrusted comment: y\n",
        b"\xff\xfe",
    ],
)
def test_a_malformed_signature_file_is_refused(text: bytes) -> None:
    with pytest.raises(signing.SignatureError):
        signing.Signature.parse(text)


def test_a_signed_driver_source_verifies_with_its_public_key(tmp_path: Path) -> None:
    key = signing.SecretKey.generate()
    packaging.build_driver_source(tmp_path, [("gpu", "1.0", "6.1")], signing_key=key)
    signature = signing.Signature.parse((tmp_path / "index.json.minisig").read_bytes())
    assert signature.trusted_comment.endswith("\tfile:index.json\thashed")
    index = (tmp_path / "index.json").read_bytes()
    assert signing.verify(index, signature, [key.public_key]) == key.public_key
