"""Whether a driver source's `index.json` may be believed: its minisign signature, checked
against the keys the policy trusts for that source, before any digest in it is used.

Called by `sources` for every index it reads (`index()`), with the index's bytes and those of
`index.json.minisig` beside it (None when the source has none). The index lists each
package's sha256, and the install checks every archive against it, so a signed index
authenticates the packages too; an unsigned one only says the archive is what the same
server meant to send.

    signed by a trusted key, trusted comment intact      believed
    signed, by no trusted key or not verifying           refused, whatever allowUnsigned says
    signed, the command trusts no key                    refused (believed, with a warning,
                                                         under allowUnsigned)
    signed before `signed_after` (the anchor's max age)  refused: a replayed old index
    unsigned                                             refused; believed, with a warning,
                                                         under allowUnsigned
    unsigned over plain http://                          refused, allowUnsigned or not: no
                                                         signature and no TLS is no integrity

A refusal is an `UntrustedIndex`, which `sources` reports as `verification-failed` (not
retryable: the same index will not verify later).
"""

from __future__ import annotations

import logging

from gpuop.events import driver as dm
from gpuop.host import packaging, signing
from gpuop.services.driver_manager import anchors

log = logging.getLogger(__name__)

SIGNATURE = packaging.INDEX + signing.SUFFIX
"""The index's signature file, beside it."""
MAX_SIGNATURE_BYTES = signing.MAX_SIGNATURE_FILE

HOW_TO_SIGN = (
    f"sign it (`minisign -S -m {packaging.INDEX}`, or gpuop.host.packaging.sign_driver_source) "
    "and list the public key in the driver's publicKeys"
)


class UntrustedIndex(Exception):
    """The index must not be used; the message says why and what would fix it."""


def check_index(
    data: bytes,
    signature: bytes | None,
    uri: str,
    trust: dm.DriverSource,
    *,
    plain_http: bool,
    signed_after: float | None = None,
) -> None:
    """Return when the index `data` read from `uri` (already `sources.redacted`: it is
    logged) may be believed under `trust` (the command's source, with its keys and opt-out,
    as the node's anchor admitted it); `UntrustedIndex` otherwise. `plain_http`: the index
    came over `http://`; `signed_after` (epoch seconds): a signed index whose trusted
    timestamp is older, or that has none, is refused (a replayed old index)."""
    if signature is None:
        if plain_http:
            raise UntrustedIndex(
                f"{uri}: {packaging.INDEX} has no {SIGNATURE}, and a source served over plain "
                f"http:// must be signed (allowUnsigned does not cover http): {HOW_TO_SIGN}, or "
                "serve it over https"
            )
        if not trust.allow_unsigned:
            raise UntrustedIndex(
                f"{uri}: {packaging.INDEX} has no {SIGNATURE}: {HOW_TO_SIGN}, or set "
                "allowUnsigned: true on this driver to trust the source unsigned"
            )
        log.warning(
            "%s: %s is not signed; installing from it because the policy allows unsigned "
            "indexes for this driver (allowUnsigned)",
            uri,
            packaging.INDEX,
        )
        return
    if not trust.public_keys:
        if trust.allow_unsigned and not plain_http:
            log.warning(
                "%s: %s is signed but no publicKeys are listed to check it; installing from it "
                "unchecked (allowUnsigned)",
                uri,
                packaging.INDEX,
            )
            return
        raise UntrustedIndex(
            f"{uri}: {packaging.INDEX} is signed, but the driver lists no publicKeys to "
            "verify it with: add the source's public key to the policy"
        )
    try:
        keys = [signing.PublicKey.from_base64(key) for key in trust.public_keys]
        parsed = signing.Signature.parse(signature)
        signer = signing.verify(data, parsed, keys)
    except signing.SignatureError as exc:
        raise UntrustedIndex(f"{uri}: {SIGNATURE} does not verify: {exc}") from None
    stamped = anchors.signed_at(parsed.trusted_comment)
    if signed_after is not None and (stamped is None or stamped < signed_after):
        when = "no timestamp" if stamped is None else f"timestamp {int(stamped)}"
        raise UntrustedIndex(
            f"{uri}: {packaging.INDEX} is signed with {when}, older than the node's "
            f"max_index_age_seconds allows (signed after {int(signed_after)}): a replayed old "
            "index is not believed; sign the index again"
        )
    log.info(
        "%s: %s signed by key %s (trusted comment: %s)",
        uri,
        packaging.INDEX,
        signer.key_id_hex,
        parsed.trusted_comment,
    )
