"""minisign keys and signatures: how a driver source's `index.json` is authenticated.

`gpuop.host.packaging.sign_driver_source` signs an index (admins, the demo, the tests); the
driver-manager verifies it (`gpuop.services.driver_manager.sources`) against the public keys
the policy trusts for that source before it believes any digest in it. The files are
minisign's (jedisct1/minisign `src/minisign.c`), so `minisign -Vm index.json -P RW...`
checks what gpuop signed, and gpuop checks what `minisign -S` signed:

    public key    `untrusted comment: minisign public key <KEYID>`, then base64 of
                  "Ed" || key id (8 bytes) || Ed25519 public key (32): `RW...`, 56 characters.
                  KEYID is the key id read little-endian, as 16 upper-case hex digits.
    signature     `<file>.minisig`, four lines:
                  `untrusted comment: <text>`          not authenticated
                  base64 of algorithm (2) || key id (8) || Ed25519 signature (64); algorithm
                  "ED" signs BLAKE2b-512 of the file (minisign's default), legacy "Ed" the
                  file itself; both verify, gpuop signs "ED"
                  `trusted comment: <text>`
                  base64 of the global signature: Ed25519 over signature || trusted comment
    secret key    minisign's own file (what `minisign -G` writes and `minisign -S -s`
                  reads): `untrusted comment: ...`, then base64 of "Ed" || KDF || "B2" ||
                  salt (32) || opslimit (8, little-endian) || memlimit (8) || key id (8) ||
                  Ed25519 seed (32) || public key (32) || BLAKE2b-256("Ed" || key id ||
                  seed || public key) (32). KDF "\\0\\0": unencrypted (`minisign -G -W`,
                  which since 0.11 leaves the checksum zero: the public half, derived
                  again from the seed, is then the only check); KDF "Sc": the last 104
                  bytes are XORed with scrypt(password, salt) at the N, r, p that libsodium
                  picks from opslimit and memlimit (`_scrypt_parameters`; minisign's
                  defaults take 1 GiB and a few seconds), and the checksum tells a wrong
                  password. gpuop writes unencrypted keys (`gpuop package keygen`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SUFFIX = ".minisig"
"""A signature file's name is the signed file's plus this."""
LEGACY = b"Ed"
"""Signature algorithm over the file's bytes (and every key's algorithm)."""
PREHASHED = b"ED"
"""Signature algorithm over BLAKE2b-512 of the file: minisign's default since 0.10."""
UNTRUSTED_PREFIX = "untrusted comment: "
TRUSTED_PREFIX = "trusted comment: "
MAX_TRUSTED_COMMENT = 8192 - len(TRUSTED_PREFIX) - 1
"""minisign refuses longer trusted comments (`TRUSTEDCOMMENTMAXBYTES`)."""
MAX_SIGNATURE_FILE = 16 << 10
"""A signature file is four short lines; anything much larger is not one."""

PASSWORD_VARIABLE = "GPUOP_SIGN_KEY_PASSWORD"
"""The environment variable gpuop reads an encrypted secret key's password from."""
MAX_SCRYPT_MEMORY = (1 << 31) - 2
"""The most memory an encrypted key's scrypt may ask for (minisign's default is 1 GiB; the
bound is what Python's `hashlib.scrypt` accepts)."""

_KDF_NONE = b"\0\0"
_KDF_SCRYPT = b"Sc"
_CHECKSUM = b"B2"


class SignatureError(Exception):
    """A key or signature is malformed, or a signature does not verify."""


def _decode(text: str, size: int, what: str) -> bytes:
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"{what} is not base64") from None
    if len(data) != size:
        raise SignatureError(f"{what} holds {len(data)} bytes, not {size}")
    return data


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class PublicKey:
    """A minisign public key: its 8-byte id and the Ed25519 key."""

    key_id: bytes
    key: bytes

    @classmethod
    def from_base64(cls, text: str) -> PublicKey:
        """The key of a `RW...` string (a `minisign.pub`'s second line, or `-P`'s argument)."""
        data = _decode(text, 42, "a minisign public key")
        if data[:2] != LEGACY:
            raise SignatureError(f"unsupported public key algorithm {data[:2]!r}")
        return cls(data[2:10], data[10:])

    @classmethod
    def from_file_text(cls, text: str) -> PublicKey:
        """The key of a `minisign.pub` file (comment line, key line)."""
        lines = text.splitlines()
        if len(lines) < 2 or not lines[0].startswith(UNTRUSTED_PREFIX):
            raise SignatureError("a minisign public key file has a comment line, then the key")
        return cls.from_base64(lines[1])

    def to_base64(self) -> str:
        return _encode(LEGACY + self.key_id + self.key)

    @property
    def key_id_hex(self) -> str:
        """The id as minisign prints it."""
        return f"{int.from_bytes(self.key_id, 'little'):016X}"

    def file_text(self) -> str:
        """The `minisign.pub` file of this key."""
        return f"{UNTRUSTED_PREFIX}minisign public key {self.key_id_hex}\n{self.to_base64()}\n"

    def _verify(self, signature: bytes, message: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.key).verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class SecretKey:
    """A minisign secret key: its id and the Ed25519 seed."""

    key_id: bytes
    seed: bytes

    @classmethod
    def generate(cls) -> SecretKey:
        """A new key pair (a random id, as `minisign -G` chooses)."""
        return cls(secrets.token_bytes(8), secrets.token_bytes(32))

    @property
    def public_key(self) -> PublicKey:
        raw = self._private().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return PublicKey(self.key_id, raw)

    @classmethod
    def from_file_text(cls, text: str, password: str | None = None) -> SecretKey:
        """The key of a minisign secret key file; `password` opens an encrypted one."""
        lines = text.splitlines()
        if len(lines) < 2 or not lines[0].startswith(UNTRUSTED_PREFIX):
            raise SignatureError("a minisign secret key file has a comment line, then the key")
        data = _decode(lines[1], 158, "a minisign secret key")
        algorithm, kdf, checksum_algorithm = data[0:2], data[2:4], data[4:6]
        if algorithm != LEGACY or checksum_algorithm != _CHECKSUM:
            raise SignatureError("unsupported minisign secret key algorithm")
        sealed = data[54:158]
        if kdf == _KDF_SCRYPT:
            if password is None:
                raise SignatureError(
                    "the secret key is password-protected: give its password (gpuop reads "
                    f"${PASSWORD_VARIABLE}, or asks on a terminal), or remove it with "
                    "`minisign -C -W -s <file>`"
                )
            stream = _scrypt(password, salt=data[6:38], opslimit=data[38:46], memlimit=data[46:54])
            sealed = bytes(a ^ b for a, b in zip(sealed, stream, strict=True))
        elif kdf != _KDF_NONE:
            raise SignatureError(f"unsupported key derivation {kdf!r} in the secret key")
        key_id, seed, public, checksum = sealed[:8], sealed[8:40], sealed[40:72], sealed[72:]
        unchecked = kdf == _KDF_NONE and checksum == bytes(32)
        if not unchecked and not hmac.compare_digest(checksum, _checksum(key_id, seed + public)):
            if kdf == _KDF_SCRYPT:
                raise SignatureError("the password does not open the secret key")
            raise SignatureError("the secret key's checksum does not match: the file is damaged")
        key = cls(key_id, seed)
        if key.public_key.key != public:
            raise SignatureError("the secret key's public half does not match its seed")
        return key

    def file_text(self, comment: str = "minisign secret key (unencrypted)") -> str:
        """The unencrypted minisign secret key file of this key."""
        secret = self.seed + self.public_key.key
        body = LEGACY + _KDF_NONE + _CHECKSUM + bytes(32) + bytes(8) + bytes(8)
        body += self.key_id + secret + _checksum(self.key_id, secret)
        return f"{UNTRUSTED_PREFIX}{comment}\n{_encode(body)}\n"

    def _private(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed)


def encrypted(text: str) -> bool:
    """Whether a minisign secret key file's key is password-protected (KDF "Sc")."""
    lines = text.splitlines()
    try:
        return (
            len(lines) > 1 and _decode(lines[1], 158, "a minisign secret key")[2:4] == _KDF_SCRYPT
        )
    except SignatureError:
        return False


def _checksum(key_id: bytes, secret: bytes) -> bytes:
    return hashlib.blake2b(LEGACY + key_id + secret, digest_size=32).digest()


def _scrypt_parameters(opslimit: int, memlimit: int) -> tuple[int, int, int]:
    """scrypt's (N, r, p) for libsodium's opslimit and memlimit, as its
    `crypto_pwhash_scryptsalsa208sha256` picks them (and so minisign)."""
    opslimit = max(opslimit, 32768)
    r = 8
    by_ops = opslimit < memlimit // 32
    most = opslimit // (r * 4) if by_ops else memlimit // (r * 128)
    log2 = 1
    while log2 < 63 and (1 << log2) <= most // 2:
        log2 += 1
    p = 1 if by_ops else min((opslimit // 4) // (1 << log2), 0x3FFFFFFF) // r
    return 1 << log2, r, p


def _scrypt(password: str, *, salt: bytes, opslimit: bytes, memlimit: bytes) -> bytes:
    """The 104-byte key stream that seals an encrypted minisign secret key."""
    n, r, p = _scrypt_parameters(
        int.from_bytes(opslimit, "little"), int.from_bytes(memlimit, "little")
    )
    if n * r * 128 > MAX_SCRYPT_MEMORY:
        raise SignatureError(
            f"the secret key asks scrypt for {n * r * 128 >> 20} MiB; at most 2 GiB"
        )
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=MAX_SCRYPT_MEMORY, dklen=104
    )


@dataclass(frozen=True)
class Signature:
    """A parsed `.minisig` file."""

    algorithm: bytes
    key_id: bytes
    signature: bytes
    trusted_comment: str
    """Authenticated by `global_signature`, once `verify` has checked it."""
    global_signature: bytes
    untrusted_comment: str = "signature from minisign secret key"

    @classmethod
    def parse(cls, data: bytes) -> Signature:
        if len(data) > MAX_SIGNATURE_FILE:
            raise SignatureError(f"a signature file is not {len(data)} bytes long")
        try:
            # minisign reads lines with fgets and drops only the line ends (`trim`)
            lines = [line.removesuffix("\r") for line in data.decode("utf-8").split("\n")]
        except UnicodeDecodeError:
            raise SignatureError("the signature file is not text") from None
        if len(lines) < 4:
            raise SignatureError("a minisign signature file has four lines")
        untrusted, packed, trusted, global_signature = lines[:4]
        if not untrusted.startswith(UNTRUSTED_PREFIX):
            raise SignatureError(f"line 1 does not start with {UNTRUSTED_PREFIX!r}")
        if not trusted.startswith(TRUSTED_PREFIX):
            raise SignatureError(f"line 3 does not start with {TRUSTED_PREFIX!r}")
        body = _decode(packed, 74, "the signature (line 2)")
        if body[:2] not in (PREHASHED, LEGACY):
            raise SignatureError(f"unsupported signature algorithm {body[:2]!r}")
        return cls(
            algorithm=body[:2],
            key_id=body[2:10],
            signature=body[10:],
            trusted_comment=trusted.removeprefix(TRUSTED_PREFIX),
            global_signature=_decode(global_signature, 64, "the global signature (line 4)"),
            untrusted_comment=untrusted.removeprefix(UNTRUSTED_PREFIX),
        )

    def file_text(self) -> str:
        """The `.minisig` file of this signature."""
        return (
            f"{UNTRUSTED_PREFIX}{self.untrusted_comment}\n"
            f"{_encode(self.algorithm + self.key_id + self.signature)}\n"
            f"{TRUSTED_PREFIX}{self.trusted_comment}\n"
            f"{_encode(self.global_signature)}\n"
        )


def _signed_message(algorithm: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=64).digest() if algorithm == PREHASHED else data


def sign(data: bytes, key: SecretKey, trusted_comment: str, *, legacy: bool = False) -> Signature:
    """Sign `data` as `minisign -S` does (prehashed, unless `legacy`)."""
    if "\n" in trusted_comment or "\r" in trusted_comment:
        raise ValueError("a trusted comment is one line")
    if len(trusted_comment.encode()) > MAX_TRUSTED_COMMENT:
        raise ValueError("the trusted comment is longer than minisign accepts")
    algorithm = LEGACY if legacy else PREHASHED
    private = key._private()
    signature = private.sign(_signed_message(algorithm, data))
    global_signature = private.sign(signature + trusted_comment.encode())
    return Signature(algorithm, key.key_id, signature, trusted_comment, global_signature)


def verify(data: bytes, signature: Signature, keys: Iterable[PublicKey]) -> PublicKey:
    """The key among `keys` whose signature `signature` is, over `data` and over its trusted
    comment; `SignatureError` saying what failed otherwise."""
    candidates = [key for key in keys if key.key_id == signature.key_id]
    if not candidates:
        key_id = f"{int.from_bytes(signature.key_id, 'little'):016X}"
        raise SignatureError(f"signed by key {key_id}, which is not a trusted key")
    message = _signed_message(signature.algorithm, data)
    for key in candidates:
        if not key._verify(signature.signature, message):
            continue
        comment = signature.signature + signature.trusted_comment.encode()
        if not key._verify(signature.global_signature, comment):
            raise SignatureError("the trusted comment's signature does not verify")
        return key
    raise SignatureError(f"the signature does not verify with key {candidates[0].key_id_hex}")
