"""Fixtures shared by every suite: a real nats-server per test, the in-memory bus, the
recorded H200 host (and a writable, booted copy of it), a check for leaked tasks, and the
rule that a test skips only where `tests/skips.py` allows it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus, NatsServer
from gpuop.host.roots import HostRoot
from gpuop_sim import recordings
from gpuop_sim.host import seeding
from tests import skips


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A fresh JetStream server on loopback with its store under the test's tmp dir."""
    server = NatsServer(tmp_path / "nats")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def bus() -> AsyncIterator[InMemoryBus]:
    """A started in-memory bus, closed after the test; one per test, so whatever a service
    stored outlives the service's runs inside the test, as the streams outlive a pod."""
    memory = InMemoryBus()
    await memory.start()
    try:
        yield memory
    finally:
        await memory.close()


@pytest.fixture
def recorded() -> HostRoot:
    """The recorded H200 host root itself (`gpuop_sim.recordings`); tests only read it."""
    return HostRoot(recordings.H200_HOST_ROOT)


@pytest.fixture
def seeded(recorded: HostRoot, tmp_path: Path) -> HostRoot:
    """A writable copy of the recorded host, booted with driver 580.159.04 loaded."""
    return seeding.seed_host_root(
        tmp_path / "host", recorded.path, boot_id="8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
    )


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running: they would act after it ended."""
    before = set(asyncio.all_tasks())
    yield
    leaked: list[asyncio.Task[object]] = []
    for _ in range(50):  # client libraries finish their own tasks a moment after close
        leaked = [
            t
            for t in asyncio.all_tasks() - before
            if not t.done() and t is not asyncio.current_task()
        ]
        if not leaked:
            break
        await asyncio.sleep(0.01)
    for task in leaked:
        task.cancel()
    await asyncio.gather(*leaked, return_exceptions=True)
    assert not leaked, f"test leaked tasks: {[t.get_name() for t in leaked]}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A skip not in `tests/skips.py` is reported as a failure that gives its reason."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and not hasattr(report, "wasxfail") and item.nodeid not in skips.ALLOWED:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} skipped ({reason}), and only the skips in tests/skips.py are allowed:"
            " a missing tool or fixture must fail and say what to install"
        )
