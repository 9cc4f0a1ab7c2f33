"""nkeys and NATS JWTs as NATS writes them: the encodings round-trip, a key of another kind
or a flipped character is refused by name, and a JWT is accepted only with its issuer's
signature, of its type and in its time."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from gpuop.bus import natsjwt, nkeys

ZERO_ACCOUNT = nkeys.encode_public(nkeys.Kind.ACCOUNT, bytes(32))


def test_the_checksum_is_crc16_xmodem() -> None:
    assert nkeys.crc16(b"123456789") == 0x31C3
    assert nkeys.crc16(b"") == 0


@pytest.mark.parametrize("kind", list(nkeys.Kind))
def test_seeds_and_public_keys_round_trip_with_their_kind_letter(kind: nkeys.Kind) -> None:
    pair = nkeys.KeyPair.generate(kind)
    letter = {"ACCOUNT": "A", "CLUSTER": "C", "SERVER": "N", "OPERATOR": "O", "USER": "U"}
    assert pair.public_key.startswith(letter[kind.name])
    assert pair.seed.startswith("S" + letter[kind.name])
    again = nkeys.KeyPair.from_seed(pair.seed)
    assert (again.kind, again.public_key) == (kind, pair.public_key)
    assert nkeys.is_public(pair.public_key, kind)
    assert len(nkeys.decode_public(pair.public_key, kind)) == 32


def test_a_public_key_of_another_kind_is_refused() -> None:
    user = nkeys.KeyPair.generate(nkeys.Kind.USER).public_key
    with pytest.raises(nkeys.NkeyError, match="is not a public account key"):
        nkeys.decode_public(user, nkeys.Kind.ACCOUNT)
    assert not nkeys.is_public(user, nkeys.Kind.ACCOUNT)


def test_one_changed_character_fails_the_checksum() -> None:
    key = ZERO_ACCOUNT
    changed = key[:10] + ("B" if key[10] != "B" else "C") + key[11:]
    with pytest.raises(nkeys.NkeyError, match="wrong checksum"):
        nkeys.decode_public(changed, nkeys.Kind.ACCOUNT)


def test_a_seed_never_appears_whole_in_an_error() -> None:
    seed = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT).seed
    broken = seed[:-3] + "AAA"
    with pytest.raises(nkeys.NkeyError) as raised:
        nkeys.decode_seed(broken)
    assert seed[2:12] not in str(raised.value)


@pytest.mark.parametrize(
    "text, message",
    [("not base32!", "not base32"), ("AA", "too short"), ("", "too short")],
)
def test_text_that_is_no_key_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(nkeys.NkeyError, match=message):
        nkeys.decode_public(text, nkeys.Kind.USER)


def test_signatures_verify_only_with_the_signers_key() -> None:
    signer = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    other = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    signature = signer.sign(b"data")
    assert nkeys.verify(signer.public_key, nkeys.Kind.ACCOUNT, b"data", signature)
    assert not nkeys.verify(signer.public_key, nkeys.Kind.ACCOUNT, b"datA", signature)
    assert not nkeys.verify(other.public_key, nkeys.Kind.ACCOUNT, b"data", signature)
    assert not nkeys.verify(signer.public_key, nkeys.Kind.USER, b"data", signature)


SERVER = nkeys.KeyPair.generate(nkeys.Kind.SERVER)
NOW = 1_800_000_000.0


def request(**extra: object) -> dict[str, object]:
    return {"sub": "A", "aud": "x", "nats": {"type": natsjwt.AUTHORIZATION_REQUEST}, **extra}


def test_a_jwt_round_trips_with_issuer_time_id_and_version() -> None:
    token = natsjwt.encode(request(exp=int(NOW) + 2), SERVER, now=NOW)
    header, _, _ = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == natsjwt.HEADER
    claims = natsjwt.decode(
        token, type=natsjwt.AUTHORIZATION_REQUEST, issuer_kind=nkeys.Kind.SERVER, now=NOW
    )
    assert claims["iss"] == SERVER.public_key
    assert claims["iat"] == int(NOW)
    assert claims["nats"]["version"] == 2
    assert len(claims["jti"]) == 52  # base32 of 32 bytes, unpadded
    # the id is a hash of the standard claims: another subject, another id
    other = natsjwt.encode(request(sub="B", exp=int(NOW) + 2), SERVER, now=NOW)
    decoded = natsjwt.decode(
        other, type=natsjwt.AUTHORIZATION_REQUEST, issuer_kind=nkeys.Kind.SERVER, now=NOW
    )
    assert decoded["jti"] != claims["jti"]


def decode(token: str, **kwargs: object) -> natsjwt.Claims:
    options: dict[str, object] = {
        "type": natsjwt.AUTHORIZATION_REQUEST,
        "issuer_kind": nkeys.Kind.SERVER,
        "now": NOW,
    }
    options.update(kwargs)
    return natsjwt.decode(token, **options)  # type: ignore[arg-type]


def test_a_changed_claim_breaks_the_signature() -> None:
    token = natsjwt.encode(request(), SERVER, now=NOW)
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["sub"] = "B"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    with pytest.raises(natsjwt.JwtError, match="signature is not"):
        decode(f"{header}.{forged}.{signature}")


def test_a_jwt_signed_by_a_key_of_another_kind_is_refused() -> None:
    token = natsjwt.encode(request(), nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT), now=NOW)
    with pytest.raises(natsjwt.JwtError, match="is not a public server key"):
        decode(token)


def test_a_jwt_of_another_type_is_refused() -> None:
    token = natsjwt.encode({"sub": "U", "nats": {"type": natsjwt.USER}}, SERVER, now=NOW)
    with pytest.raises(natsjwt.JwtError, match="of type 'user', expected 'authorization_request'"):
        decode(token)


def test_an_expired_or_early_jwt_is_refused_outside_the_leeway() -> None:
    expired = natsjwt.encode(request(exp=int(NOW) - 10), SERVER, now=NOW)
    with pytest.raises(natsjwt.JwtError, match="expired 10 s ago"):
        decode(expired)
    assert decode(expired, leeway=15)["exp"] == int(NOW) - 10
    early = natsjwt.encode(request(nbf=int(NOW) + 60), SERVER, now=NOW)
    with pytest.raises(natsjwt.JwtError, match="not valid for another 60 s"):
        decode(early)


@pytest.mark.parametrize(
    "token, message",
    [
        ("a.b", "three parts"),
        ("!!.e30.AA", "not base64url|not JSON"),
        (
            base64.urlsafe_b64encode(b'{"alg":"HS256"}').decode().rstrip("=") + ".e30.AA",
            "not ed25519-nkey",
        ),
    ],
)
def test_malformed_jwts_say_what_is_wrong(token: str, message: str) -> None:
    with pytest.raises(natsjwt.JwtError, match=message):
        decode(token)


def test_encode_needs_a_subject_and_a_type() -> None:
    with pytest.raises(natsjwt.JwtError, match="needs a subject"):
        natsjwt.encode({"nats": {"type": "user"}}, SERVER)
    with pytest.raises(natsjwt.JwtError, match=r"needs nats\.type"):
        natsjwt.encode({"sub": "U", "nats": {}}, SERVER)


# RFC 8032, section 7.1, TEST 1: an Ed25519 secret key and its public key.
RFC8032_SECRET = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")


def pkcs8_pem(secret: bytes) -> str:
    """An Ed25519 key as PKCS#8 PEM, built by hand (RFC 8410): the fixed DER header of the
    algorithm id 1.3.101.112, then the 32 secret bytes, as Go's x509 writes it for Helm."""
    der = bytes.fromhex("302e020100300506032b657004220420") + secret
    body = base64.b64encode(der).decode("ascii")
    return f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"


def test_a_pkcs8_ed25519_pem_is_the_account_key_of_its_raw_secret_bytes() -> None:
    key = nkeys.KeyPair.from_pem(pkcs8_pem(RFC8032_SECRET), nkeys.Kind.ACCOUNT)
    assert key.public_key == nkeys.encode_public(nkeys.Kind.ACCOUNT, RFC8032_PUBLIC)
    assert key.public_key.startswith("A")
    assert key.seed == nkeys.encode_seed(nkeys.Kind.ACCOUNT, RFC8032_SECRET)
    # the PEM and its seed are one key: what one signs, the other's public key verifies
    same = nkeys.KeyPair.from_seed(key.seed)
    assert same.public_key == key.public_key
    assert nkeys.verify(same.public_key, nkeys.Kind.ACCOUNT, b"claims", key.sign(b"claims"))


def test_a_pem_that_is_no_unencrypted_ed25519_key_is_refused_without_its_bytes() -> None:
    p256 = ec.generate_private_key(ec.SECP256R1())
    plain = p256.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    with pytest.raises(nkeys.NkeyError, match="an Ed25519 key is needed, not"):
        nkeys.KeyPair.from_pem(plain, nkeys.Kind.ACCOUNT)

    ed = nkeys.KeyPair.from_pem(pkcs8_pem(RFC8032_SECRET), nkeys.Kind.ACCOUNT).private
    locked = ed.private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"secret")
    ).decode()
    with pytest.raises(nkeys.NkeyError, match="not an unencrypted PEM private key"):
        nkeys.KeyPair.from_pem(locked, nkeys.Kind.ACCOUNT)

    cut = pkcs8_pem(RFC8032_SECRET).replace("MC4CAQAw", "MC4CAQ")
    with pytest.raises(nkeys.NkeyError) as refused:
        nkeys.KeyPair.from_pem(cut, nkeys.Kind.ACCOUNT)
    assert "MC4CAQ" not in str(refused.value)
