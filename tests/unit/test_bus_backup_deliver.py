"""A restore's chunks wait for the server's deliver subscription to be known (clusters)."""

from __future__ import annotations

from typing import Any

import nats.errors
import pytest

from gpuop.bus import backup


class LateInterest:
    """A client whose deliver subject has no responders for its first `misses` requests."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.sent: list[bytes] = []

    async def request(self, subject: str, payload: bytes, timeout: float) -> Any:
        if self.misses:
            self.misses -= 1
            raise nats.errors.NoRespondersError
        self.sent.append(payload)
        return "answer"


async def test_a_chunk_without_responders_yet_is_sent_again() -> None:
    client = LateInterest(misses=3)
    assert await backup._deliver(client, "deliver", b"chunk", 1.0) == "answer"  # type: ignore[arg-type]
    assert client.sent == [b"chunk"]


async def test_a_deliver_subject_that_never_gets_a_responder_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backup, "DELIVER_INTEREST_SECONDS", 0.3)
    client = LateInterest(misses=1000)
    with pytest.raises(nats.errors.NoRespondersError):
        await backup._deliver(client, "deliver", b"chunk", 1.0)  # type: ignore[arg-type]
    assert client.sent == []
