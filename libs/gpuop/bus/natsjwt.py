"""NATS JWTs: the claims a NATS server and its auth callout exchange, signed with nkeys.

A NATS JWT is `<header>.<claims>.<signature>`, each part base64url without padding; the
header says `{"typ": "JWT", "alg": "ed25519-nkey"}` and the signature is the issuer's
Ed25519 signature over the first two parts. The claims are JWT's standard ones (`iss` is the
issuer's public nkey, `sub`, `aud`, `iat`, `exp`, `jti`, `name`) and NATS's own under
`nats`, whose `type` says what the JWT is (`user`, `authorization_request`,
`authorization_response`) and `version` is 2. `jti` is the base32 of SHA-512/256 over the
standard claims with `jti` empty, as the NATS libraries make it.

`encode` signs claims; `decode` checks the form, the signature against the issuer the claims
name, the issuer's kind, the type and the time window, and returns the claims. The callout
(`callouts`) decodes the server's requests and encodes its answers with these.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from typing import Any

from gpuop.bus import nkeys

Claims = dict[str, Any]

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
VERSION = 2

USER = "user"
AUTHORIZATION_REQUEST = "authorization_request"
AUTHORIZATION_RESPONSE = "authorization_response"

_STANDARD = ("aud", "exp", "jti", "iat", "iss", "name", "nbf", "sub")


class JwtError(ValueError):
    """A JWT that is malformed, badly signed, of another type or out of its time; the message
    says which."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise JwtError(f"a JWT part is not base64url: {exc}") from None


def _jti(claims: Claims) -> str:
    standard = {key: claims[key] for key in _STANDARD if claims.get(key) and key != "jti"}
    digest = hashlib.new("sha512_256", json.dumps(standard, separators=(",", ":")).encode())
    return base64.b32encode(digest.digest()).decode("ascii").rstrip("=")


def encode(claims: Claims, issuer: nkeys.KeyPair, *, now: float | None = None) -> str:
    """`claims` signed by `issuer`: `iss`, `iat` and `jti` are set here, `nats.version` too;
    `sub` and `nats.type` must be there already."""
    if not claims.get("sub"):
        raise JwtError("a JWT needs a subject (sub)")
    if not claims.get("nats", {}).get("type"):
        raise JwtError("a NATS JWT needs nats.type")
    claims = {
        **claims,
        "iss": issuer.public_key,
        "iat": int(now if now is not None else time.time()),
    }
    claims["jti"] = _jti(claims)
    claims["nats"] = {**claims["nats"], "version": VERSION}
    signed = f"{_b64(json.dumps(HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signed}.{_b64(issuer.sign(signed.encode('ascii')))}"


def decode(
    token: str,
    *,
    type: str,
    issuer_kind: nkeys.Kind,
    now: float | None = None,
    leeway: float = 0.0,
) -> Claims:
    """The claims of `token`, checked: three parts, an ed25519-nkey header, a signature by
    the public key in `iss` (of `issuer_kind`), `nats.type` equal to `type`, and `now`
    (default: the clock) between `nbf` and `exp` within `leeway` seconds."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError(f"a JWT has three parts separated by dots, this one has {len(parts)}")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except json.JSONDecodeError as exc:
        raise JwtError(f"a JWT part is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("alg") != HEADER["alg"]:
        raise JwtError(f"the JWT's algorithm is not ed25519-nkey: {header!r:.80}")
    if not isinstance(claims, dict):
        raise JwtError("the JWT's claims are not a JSON object")
    issuer = claims.get("iss")
    if not isinstance(issuer, str) or not nkeys.is_public(issuer, issuer_kind):
        raise JwtError(
            f"the JWT's issuer {issuer!r:.70} is not a public {issuer_kind.name.lower()} key"
        )
    signed = f"{parts[0]}.{parts[1]}".encode("ascii")
    if not nkeys.verify(issuer, issuer_kind, signed, _unb64(parts[2])):
        raise JwtError(f"the JWT's signature is not {issuer}'s")
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != type:
        got = nats.get("type") if isinstance(nats, dict) else None
        raise JwtError(f"the JWT is of type {got!r}, expected {type!r}")
    moment = now if now is not None else time.time()
    expires, not_before = claims.get("exp"), claims.get("nbf")
    if isinstance(expires, int) and expires > 0 and moment > expires + leeway:
        raise JwtError(f"the JWT expired {moment - expires:.0f} s ago")
    if isinstance(not_before, int) and not_before > 0 and not_before > moment + leeway:
        raise JwtError(f"the JWT is not valid for another {not_before - moment:.0f} s")
    return claims
