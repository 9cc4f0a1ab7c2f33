"""Attack: any pod that reaches NATS floods the auth callout with connects, so that every
connect costs a TokenReview and the callout, or the API server behind it, fails closed for
the real agents (issue 37, finding 6). Against a real nats-server running callout.conf as
shipped, the callout answering through `CachingReviewer` as `gpuop nats-auth` does, and an
authority that takes its time over each review.

The flood: tokens that are not JWTs (refused before any review), one made-up JWT again and
again (reviewed once, its refusal remembered), and made-up JWTs each new (reviewed, at most
`concurrency` at once). Meanwhile real agents connect, and connect again: each is admitted.
Each attempt's outcome is printed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import pytest

from gpuop.bus import grants, reviewers
from tests.support.callout_nats import CalloutNats, running

pytestmark = [pytest.mark.nats, pytest.mark.security]

FLOOD = 60
"""Connects of each kind; they run `PARALLEL` at a time."""
PARALLEL = 20
AGENTS = [grants.Identity(role, f"gpu-{n}") for n in (1, 2) for role in ("discovery", "telemetry")]


class SlowAuthority(reviewers.MemoryReviewer):
    """An API server under load: each review takes a while; counts the most at once."""

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.most = 0

    async def review(self, token: str) -> reviewers.ReviewedToken:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.02)
            return await super().review(token)
        finally:
            self.running -= 1


def made_up_jwt() -> str:
    def part(document: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'kid': 'x'})}.{part({'sub': 'nobody'})}.{secrets.token_hex(8)}"


@pytest.fixture
async def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CalloutNats]:
    async with running(tmp_path / "nats", reviewer=SlowAuthority(), caching=True) as callout:
        monkeypatch.setenv("SSL_CERT_FILE", str(callout.ca_file))
        yield callout


async def attempt(server: CalloutNats, token: str) -> bool:
    """One connect with `token`; whether the server let it in."""
    try:
        nc = await nats.connect(
            server.url, tls=server.tls(), token=token, allow_reconnect=False,
            max_reconnect_attempts=0, connect_timeout=5,
        )  # fmt: skip
    except (nats.errors.Error, OSError, TimeoutError):
        return False
    await nc.close()
    return True


async def flood(server: CalloutNats, tokens: list[str]) -> int:
    """Connect with every token, `PARALLEL` at a time; how many got in."""
    gate = asyncio.Semaphore(PARALLEL)

    async def one(token: str) -> bool:
        async with gate:
            return await attempt(server, token)

    return sum(await asyncio.gather(*(one(token) for token in tokens)))


async def agents_connect(server: CalloutNats, rounds: int) -> list[bool]:
    admitted = []
    tokens = {agent: server.token(agent.role, agent.node) for agent in AGENTS}
    for _ in range(rounds):
        for agent, token in tokens.items():
            nc = await server.token_client(token, agent)
            admitted.append(nc.is_connected)
            await nc.close()
    return admitted


async def test_a_connect_flood_leaves_the_callout_answering_the_real_agents(
    server: CalloutNats,
) -> None:
    authority = server.reviewer
    assert isinstance(authority, SlowAuthority)
    repeated = made_up_jwt()
    kinds = [
        ("not a JWT", [f"garbage-{n}" for n in range(FLOOD)]),
        ("one made-up JWT, again and again", [repeated] * FLOOD),
        ("made-up JWTs, each new", [made_up_jwt() for _ in range(FLOOD)]),
    ]
    rows = []
    for what, tokens in kinds:
        before = authority.reviews
        agents = asyncio.create_task(agents_connect(server, rounds=2))
        admitted = await flood(server, tokens)
        agents_admitted = await agents
        rows.append((what, admitted, authority.reviews - before, agents_admitted))

    print(f"\n{FLOOD} connects of each kind, {PARALLEL} at a time, while "
          f"{len(AGENTS)} agents connect twice each:")  # fmt: skip
    for what, admitted, reviews, agents_admitted in rows:
        print(f"  {what:<34} {admitted} admitted, {reviews} TokenReviews (agents' included); "
              f"agents admitted {sum(agents_admitted)}/{len(agents_admitted)}")  # fmt: skip
    print(f"  at most {authority.most} reviews ran at once")
    for _, admitted, _, agents_admitted in rows:
        assert admitted == 0 and all(agents_admitted)
    agents_first = len(AGENTS)  # each agent's token is reviewed once, then remembered
    assert [reviews - agents_first for _, _, reviews, _ in rows] == [0, 1, FLOOD]
    assert authority.most <= 16
