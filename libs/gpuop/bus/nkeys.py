"""NATS nkeys: Ed25519 keys written as NATS writes them, for the auth callout (`callouts`).

A public key is base32 (no padding) of one prefix byte that says what the key is (`A`
account, `U` user, `N` server, ...), the 32-byte Ed25519 public key and a CRC-16 (XMODEM,
little-endian) of those bytes; a seed is the same with two prefix bytes, `S` followed by the
key's kind, so an account seed reads `SA...`. `KeyPair` signs with a seed; `verify` checks a
signature against a public key of the kind the caller expects. The JWTs signed with these
keys are in `natsjwt`.

`from_pem` reads a PKCS#8 Ed25519 private key, as Helm's `genPrivateKey "ed25519"` writes
the chart's issuer key: its 32 raw bytes are the seed, so one key reads as PEM or `SA...`.
"""

from __future__ import annotations

import base64
import binascii
import enum
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

_SEED = 18 << 3
"""The first byte of every seed (`S` once encoded)."""


class Kind(enum.IntEnum):
    """What a key belongs to: its prefix byte, the first letter of its public form."""

    ACCOUNT = 0  # A
    CLUSTER = 2 << 3  # C
    SERVER = 13 << 3  # N
    OPERATOR = 14 << 3  # O
    USER = 20 << 3  # U


class NkeyError(ValueError):
    """Text that is not an nkey of the expected kind; the message says what is wrong."""


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum nkeys carry."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(raw: bytes) -> str:
    raw += crc16(raw).to_bytes(2, "little")
    return base64.b32encode(raw).decode("ascii").rstrip("=")


def _decode(text: str) -> bytes:
    """The bytes of an encoded key without its checksum, which must match."""
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as exc:
        raise NkeyError(f"{_shown(text)} is not base32: {exc}") from None
    if len(raw) < 3:
        raise NkeyError(f"{_shown(text)} is too short for an nkey")
    body, checksum = raw[:-2], int.from_bytes(raw[-2:], "little")
    if crc16(body) != checksum:
        raise NkeyError(f"{_shown(text)} has a wrong checksum")
    return body


def _shown(text: str) -> str:
    """A key in an error message: public keys in full, never more than a seed's kind."""
    return repr(text[:2] + "...") if text.startswith("S") else repr(text[:60])


def encode_public(kind: Kind, key: bytes) -> str:
    if len(key) != 32:
        raise NkeyError(f"an Ed25519 public key has 32 bytes, not {len(key)}")
    return _encode(bytes([kind]) + key)


def decode_public(text: str, kind: Kind) -> bytes:
    """The 32 key bytes of `text`, which must be a public key of `kind`."""
    body = _decode(text)
    if body[0] != kind or len(body) != 33:
        raise NkeyError(f"{_shown(text)} is not a public {kind.name.lower()} key")
    return body[1:]


def is_public(text: str, kind: Kind) -> bool:
    try:
        decode_public(text, kind)
    except NkeyError:
        return False
    return True


def encode_seed(kind: Kind, seed: bytes) -> str:
    if len(seed) != 32:
        raise NkeyError(f"an Ed25519 seed has 32 bytes, not {len(seed)}")
    return _encode(bytes([_SEED | kind >> 5, (kind & 31) << 3]) + seed)


def decode_seed(text: str) -> tuple[Kind, bytes]:
    """The kind and the 32 seed bytes of an encoded seed (`SA...`, `SU...`)."""
    body = _decode(text.strip())
    if len(body) != 34 or body[0] & 0xF8 != _SEED:
        raise NkeyError(f"{_shown(text)} is not an nkey seed")
    prefix = (body[0] & 7) << 5 | (body[1] & 0xF8) >> 3
    try:
        kind = Kind(prefix)
    except ValueError:
        raise NkeyError(f"{_shown(text)} is a seed of no known kind ({prefix})") from None
    return kind, body[2:]


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A key that signs: an account's (the callout's issuer) or a user's."""

    kind: Kind
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls, kind: Kind) -> KeyPair:
        return cls.from_seed(encode_seed(kind, secrets.token_bytes(32)))

    @classmethod
    def from_seed(cls, text: str) -> KeyPair:
        kind, seed = decode_seed(text)
        return cls(kind, Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_pem(cls, text: str, kind: Kind) -> KeyPair:
        """The key of an unencrypted PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), which must
        be an Ed25519 key, as a key of `kind`."""
        try:
            private = load_pem_private_key(text.encode("ascii"), password=None)
        except (ValueError, TypeError, UnicodeEncodeError) as exc:
            # the library's message never quotes the key's bytes
            raise NkeyError(f"not an unencrypted PEM private key: {exc}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise NkeyError(f"an Ed25519 key is needed, not {type(private).__name__}")
        return cls(kind, private)

    @property
    def public_key(self) -> str:
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return encode_public(self.kind, raw)

    @property
    def seed(self) -> str:
        raw = self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return encode_seed(self.kind, raw)

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)


def verify(public_key: str, kind: Kind, data: bytes, signature: bytes) -> bool:
    """Whether `signature` is `public_key`'s over `data`; False as well when the key is not a
    public key of `kind`."""
    try:
        key = Ed25519PublicKey.from_public_bytes(decode_public(public_key, kind))
        key.verify(signature, data)
    except (NkeyError, InvalidSignature):
        return False
    return True
