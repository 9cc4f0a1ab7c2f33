"""The simulation's driver-source signing key: the demo and the tests sign the driver
sources they build with it, and name its public key in their policies' `publicKeys`.

It is derived from a fixed phrase, so anyone can sign with it: it proves nothing, and a
real cluster must never list `PUBLIC_KEY`. It exists so that the simulated sources take the
same path as a real one (a signed index, verified on the node) instead of opting out with
`allowUnsigned`.
"""

from __future__ import annotations

import hashlib

from gpuop.host import signing

SIGNING_KEY = signing.SecretKey(
    key_id=b"gpuopsim",
    seed=hashlib.sha256(b"gpuop simulation: driver source signing key").digest(),
)
"""Signs the simulated driver sources (`packaging.build_driver_source(signing_key=...)`)."""
PUBLIC_KEY = SIGNING_KEY.public_key.to_base64()
"""`SIGNING_KEY`'s public half as the policy lists it (`RW...`)."""

TRUST = {
    "public_keys": [PUBLIC_KEY],
    "sources": ["/", "file://", "http://127.0.0.1:", "https://127.0.0.1:"],
}
"""The driver-manager's trust anchor (its config's `trust:`) on a simulated node: this key,
and sources on the agent's own filesystem or served on loopback. A real node lists its own
mirror and its publisher's key."""
