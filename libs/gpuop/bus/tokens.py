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
from pathlib import Path

import nats.errors
from nats.aio.client import Client

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
