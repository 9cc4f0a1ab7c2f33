"""The IPAM bucket of the in-memory bus, for network-manager's unit tests."""

from __future__ import annotations

import pytest

from gpuop.bus import Buckets, InMemoryBus, KeyValue


@pytest.fixture
async def ipam(bus: InMemoryBus) -> KeyValue:
    return await bus.kv(Buckets.IPAM)
