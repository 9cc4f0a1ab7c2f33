"""One network-manager cannot fill the IPAM bucket for every node (issue 37, finding 5): under
the callout's per-node user, against a real nats-server running callout.conf as shipped, with
the bucket as the services make it. The bucket takes no value over `streams.VALUE_BYTES`,
whoever writes it (nats-server applies no payload limit per user: `streams.VALUE_BYTES` says
why), and a key the node may write under its name must have a claim's or a record's shape; a
claim of its own still goes through. Each attempt's outcome is printed."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest

from gpuop.bus import grants, streams
from gpuop.bus.protocol import Buckets
from gpuop.services.network_manager.addressing import ClaimValue
from tests.support.callout_nats import CalloutNats
from tests.support.shipped_nats import Refusals

pytestmark = [pytest.mark.nats, pytest.mark.security]

SQUATTER = grants.Identity("network-manager", "gpu-2")
BUCKET = "$KV.gpuop_ipam"
CLAIM = f"{BUCKET}.claim.gpu-2.10.10.0.0_24.10.10.0.7"
VALUE = ClaimValue(node="gpu-2", network="roce", address="10.10.0.7/24").model_dump_json()


@pytest.fixture
def server(callout_server: CalloutNats) -> CalloutNats:
    return callout_server


async def write(server: CalloutNats, subject: str, value: bytes) -> str:
    """One write of the squatter's, on a connection of its own; what became of it."""
    refusals = Refusals()
    token = server.token(SQUATTER.role, SQUATTER.node)
    refusals.nc = await server.token_client(token, SQUATTER, error_cb=refusals.record)
    try:
        await refusals.nc.jetstream().publish(subject, value, timeout=2)
    except nats.js.errors.APIError as exc:
        return f"refused by the bucket: {exc.description}"
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        await asyncio.sleep(0.2)  # the server's -ERR, or its closing of the connection
        if refusals.refused_publish(subject):
            return "refused: permissions violation"
        return "no answer"
    finally:
        await refusals.nc.close()
    return "written"


async def test_a_network_manager_cannot_fill_the_ipam_bucket_with_large_values_or_made_up_keys(
    server: CalloutNats,
) -> None:
    over = streams.VALUE_BYTES[Buckets.IPAM] + 1
    record = f"{BUCKET}.node.gpu-2.roce"
    attempts = [
        ("a claim of its own", CLAIM, VALUE.encode()),
        ("a record of 1000 KB", record, b"x" * 1_000_000),
        (f"a record of {over} bytes", record, b"x" * over),
        ("a made-up key under its name", f"{BUCKET}.claim.gpu-2.filler", VALUE.encode()),
        ("a longer made-up key", f"{BUCKET}.claim.gpu-2.a.b.c.d.e.f.g.h.i", VALUE.encode()),
    ]  # fmt: skip
    rows = [
        (what, subject, await write(server, subject, value)) for what, subject, value in attempts
    ]

    print(f"\nnetwork-manager@{SQUATTER.node} writing to the IPAM bucket:")
    for what, subject, outcome in rows:
        print(f"  {what:<30} {subject:<46} {outcome}")
    outcomes = [outcome for _, _, outcome in rows]
    assert outcomes[0] == "written"
    assert outcomes[1:3] == ["refused by the bucket: message size exceeds maximum allowed"] * 2
    assert outcomes[3:] == ["refused: permissions violation"] * 2
