"""The shipped NATS configuration in a real server, one per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

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
