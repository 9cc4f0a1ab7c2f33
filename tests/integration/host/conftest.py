"""Host roots for the `gpuop.host` tests: the recorded H200 host, read-only, and a seeded
writable copy of it with a simulated kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.host import seeding
from gpuop.host.roots import HostRoot

RECORDED = seeding.find_recorded_host(Path(__file__))


@pytest.fixture
def recorded() -> HostRoot:
    """The recorded H200 host root itself; tests only read it."""
    if RECORDED is None:
        pytest.skip("shared/fixtures/h200 is not beside the checkout")
    return HostRoot(RECORDED)


@pytest.fixture
def seeded(recorded: HostRoot, tmp_path: Path) -> HostRoot:
    """A writable copy of the recorded host, booted with driver 580.159.04 loaded."""
    return seeding.seed_host_root(
        tmp_path / "host", recorded.path, boot_id="8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
    )
