"""A rotating token file and a publisher's own id key (callout mode): the token is the file's
content at each connect, the last good one while the kubelet swaps it, and an error naming
the file when there never was one; a changed file makes the client reconnect; the id key is
made once, private, and read back; only an expired user makes nats-py's client reconnect
instead of close."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from gpuop.bus import tokens
from gpuop.bus.errors import BusUnavailable


def test_the_token_is_the_files_content_at_each_read(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    token = tokens.TokenFile(path)
    assert token() == "first"
    path.write_text("second")
    assert token() == "second"
    path.unlink()  # the kubelet's swap, caught in the middle
    assert token() == "second"
    path.write_text("")
    assert token() == "second"


def test_a_token_file_that_never_was_readable_names_itself(tmp_path: Path) -> None:
    with pytest.raises(nats.errors.Error, match=r"cannot read the NATS token file .*absent"):
        tokens.TokenFile(tmp_path / "absent").read()
    (tmp_path / "empty").write_text("  \n")
    with pytest.raises(nats.errors.Error, match=r"the NATS token file .*empty is empty"):
        tokens.TokenFile(tmp_path / "empty").read()


def test_the_id_key_is_made_once_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "key"
    made = tokens.id_key(path)
    assert len(made) == 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert tokens.id_key(path) == made
    assert tokens.id_key(tmp_path / "other") != made


def test_an_unusable_id_key_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(BusUnavailable, match=r"the message id key .*empty is empty"):
        tokens.id_key(tmp_path / "empty")
    with pytest.raises(BusUnavailable, match=r"cannot make the message id key .*nowhere"):
        tokens.id_key(tmp_path / "nowhere" / "key")


class FakeClient:
    def __init__(self) -> None:
        self.is_connected = True
        self.reconnects = 0

    async def force_reconnect(self) -> None:
        self.reconnects += 1


async def test_a_rewritten_token_file_makes_the_client_reconnect(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    client = FakeClient()
    token = tokens.TokenFile(path)
    watching = asyncio.create_task(
        tokens.watch(client, token, interval=0.01)  # type: ignore[arg-type]
    )
    try:
        await asyncio.sleep(0.05)
        assert client.reconnects == 0
        replacement = tmp_path / "token.new"
        replacement.write_text("second")
        os.replace(replacement, path)  # a new inode, as the kubelet's swap makes
        while client.reconnects == 0:
            await asyncio.sleep(0.01)
        assert client.reconnects == 1
    finally:
        watching.cancel()


class Recorded(tokens.RotatingClient):
    def __init__(self) -> None:
        super().__init__()
        self.options["allow_reconnect"] = True
        self.op_errors: list[Exception] = []
        self.closed_with: list[str] = []

    async def _process_op_err(self, e: Exception) -> None:
        self.op_errors.append(e)

    async def _close(self, status: Any, do_cbs: bool = True) -> None:
        self.closed_with.append(str(status))


async def test_only_an_expired_user_reconnects_instead_of_closing() -> None:
    client = Recorded()
    await client._process_err("'User Authentication Expired'")
    assert [str(e) for e in client.op_errors] == ["nats: 'User Authentication Expired'"]
    await client._process_err("'Authorization Violation'")
    await asyncio.sleep(0)  # nats-py closes in a task of its own
    assert len(client.op_errors) == 1
    assert client.closed_with  # as nats-py does
