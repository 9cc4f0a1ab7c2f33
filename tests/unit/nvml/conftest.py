"""Where the recorded H200 lives, and a clock the simulated GPUs can be driven by."""

from __future__ import annotations

import pytest

from gpuop_sim import recordings

FIXTURE_DIR = recordings.H200
"""The recorded H200 node, inside the project."""
NVML_JSON = recordings.H200_NVML
"""The recorded answers."""


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
