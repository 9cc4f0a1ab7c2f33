"""Authorization requests as nats-server sends them to its auth callout, for testing the
callout (`gpuop.bus.callouts`) without a server."""

from __future__ import annotations

import time
from typing import Any

from gpuop.bus import callouts, natsjwt, nkeys

SERVER = nkeys.KeyPair.generate(nkeys.Kind.SERVER)
"""The server key every request is signed with unless a test says otherwise."""


def authorization_request(
    token: str | None,
    *,
    issuer: str,
    signer: nkeys.KeyPair = SERVER,
    audience: str = callouts.REQUEST_AUDIENCE,
    expires_in: float = 3.0,
    user_nkey: str | None = None,
) -> tuple[bytes, str]:
    """A request for a client that connected with `token`, to the callout that signs as
    `issuer`; the request and the user key it asks a user for."""
    user = user_nkey or nkeys.KeyPair.generate(nkeys.Kind.USER).public_key
    connect: dict[str, Any] = {"protocol": 1, "lang": "python3"}
    if token is not None:
        connect["auth_token"] = token
    claims = {
        "sub": issuer,
        "aud": audience,
        "exp": int(time.time() + expires_in),
        "nats": {
            "type": natsjwt.AUTHORIZATION_REQUEST,
            "server_id": {"name": "gpuop-nats", "host": "0.0.0.0", "id": SERVER.public_key},
            "user_nkey": user,
            "client_info": {"host": "10.0.0.7", "id": 5, "kind": "Client", "type": "nats"},
            "connect_opts": connect,
        },
    }
    return natsjwt.encode(claims, signer).encode("ascii"), user
