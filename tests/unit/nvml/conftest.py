"""Where the recorded H200 lives, and the test clock the simulated GPUs are driven by."""

from __future__ import annotations

import pytest

from gpuop_sim import recordings
from tests.support.clocks import ManualClock

FIXTURE_DIR = recordings.H200
"""The recorded H200 node, inside the project."""
NVML_JSON = recordings.H200_NVML
"""The recorded answers."""


@pytest.fixture
def clock() -> ManualClock:
    """The simulated GPUs' pace: seconds that move only when the test advances them."""
    return ManualClock()
