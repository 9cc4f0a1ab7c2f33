"""A NATS connection that authenticates with a token file which rotates under it.

In callout mode (deploy/nats/callout.conf) a service connects with its Kubernetes
service-account token, projected into its pod as a file the kubelet rewrites before the
token expires. The user the callout makes of it expires with the token, and the server then
disconnects the client with `User Authentication Expired`.

- `TokenFile` is the token nats-py sends on every connect and reconnect: the file's content
  at that moment, so a reconnect always presents the newest token.
- `RotatingClient` is nats-py's client that takes that disconnect as a lost connection and
  reconnects (with the file's new token), where nats-py would close for good: every
  consumer, subscription and KV watch of the bus lives on, as across a server restart.
- `watch` reconnects as soon as the file changes, so that a client normally moves to its
  new token before its user expires, and the expiry is only the fallback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client

from gpuop.bus.errors import BusUnavailable

log = logging.getLogger(__name__)

EXPIRED = "user authentication expired"
"""What nats-server says (lower-cased) before it closes a connection whose user expired."""


class TokenFile:
    """The token in `path`, read at every (re)connect; the last one read while the file cannot
    be (the kubelet replaces it through a symlink swap), and an error naming the file when it
    never could."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._last = ""

    def read(self) -> str:
        try:
            token = self.path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            if self._last:
                log.warning(
                    "cannot read the NATS token file %s (%s); using the last", self.path, exc
                )
                return self._last
            raise nats.errors.Error(f"cannot read the NATS token file {self.path}: {exc}") from exc
        if not token:
            if self._last:
                return self._last
            raise nats.errors.Error(f"the NATS token file {self.path} is empty")
        self._last = token
        return token

    def __call__(self) -> str:
        return self.read()

    def stamp(self) -> tuple[int, int] | None:
        """What changes when the kubelet writes a new token: the file's inode and mtime."""
        try:
            status = self.path.stat()
        except OSError:
            return None
        return status.st_ino, status.st_mtime_ns


class RotatingClient(Client):
    """nats-py's client, reconnecting when the server ends the connection because its user
    expired (nats-py 2.16 closes the client on any -ERR but a stale connection)."""

    async def _process_err(self, err_msg: str) -> None:
        if EXPIRED in err_msg.lower() and self.options.get("allow_reconnect"):
            log.info("the NATS user expired with its token; reconnecting with the token file's")
            await self._process_op_err(nats.errors.Error(f"nats: {err_msg.strip()}"))
            return
        await super()._process_err(err_msg)


async def connect(**options: Any) -> RotatingClient:
    """`nats.connect` with a `RotatingClient`."""
    nc = RotatingClient()
    await nc.connect(**options)
    return nc


async def watch(nc: Client, token: TokenFile, *, interval: float = 10.0) -> None:
    """Reconnect `nc` whenever `token`'s file is rewritten, until cancelled."""
    seen = token.stamp()
    while True:
        await asyncio.sleep(interval)
        stamp = token.stamp()
        if stamp is None or stamp == seen:
            continue
        seen = stamp
        if nc.is_connected:
            log.info("the NATS token file %s changed; reconnecting with the new token", token.path)
            await nc.force_reconnect()


def id_key(path: str | os.PathLike[str]) -> bytes:
    """The key of a publisher's message ids (`publishing.message_id`) from `path`, made there
    with 32 random bytes (mode 0600) when the file does not exist yet.

    With passwords, each user's password keys its ids; a token is no such secret (it rotates,
    and every node agent of a service would share its role). The key must stay the same for
    one publisher across retries and restarts, and be unknown to every other publisher: the
    chart gives a node agent a file in a volume of its own pod and a cluster role one from a
    Secret its replicas share. An unreadable or empty file is an error that names it."""
    file = Path(path)
    try:
        key = file.read_bytes()
    except FileNotFoundError:
        try:
            descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process of the pod made it meanwhile
            return id_key(file)
        except OSError as exc:
            raise BusUnavailable(f"cannot make the message id key {file}: {exc}") from exc
        key = secrets.token_bytes(32)
        with os.fdopen(descriptor, "wb") as out:
            out.write(key)
        return key
    except OSError as exc:
        raise BusUnavailable(f"cannot read the message id key {file}: {exc}") from exc
    if not key.strip():
        raise BusUnavailable(f"the message id key {file} is empty")
    return key
