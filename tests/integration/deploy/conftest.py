"""The shipped NATS configuration in a real server, one per test: accounts.conf's password
users (`server`), or callout.conf with gpuop's auth callout (`callout_server`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.callout_nats import CalloutNats, running
from tests.support.shipped_nats import ShippedNats


@pytest.fixture
async def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ShippedNats]:
    shipped = ShippedNats(tmp_path / "nats", trace=True)
    await shipped.start()
    # what the chart sets, so that nats-py's default TLS context trusts the server
    monkeypatch.setenv("SSL_CERT_FILE", str(shipped.ca_file))
    try:
        yield shipped
    finally:
        await shipped.stop()


@pytest.fixture
async def callout_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[CalloutNats]:
    async with running(tmp_path / "nats") as callout:
        monkeypatch.setenv("SSL_CERT_FILE", str(callout.ca_file))
        await callout.make_streams()
        yield callout
