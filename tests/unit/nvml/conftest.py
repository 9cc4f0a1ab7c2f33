"""Where the recorded H200 lives, and a clock the simulated GPUs can be driven by."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIXTURE_DIR = next(
    (
        base / "shared/fixtures/h200"
        for base in (ROOT, ROOT.parent)
        if (base / "shared/fixtures/h200/nvml.json").is_file()
    ),
    None,
)
"""shared/fixtures/h200 beside the checkout, when it is there."""
PACKAGED = Path(str(resources.files("gpuop.nvml").joinpath("h200_nvml.json")))
NVML_JSON = FIXTURE_DIR / "nvml.json" if FIXTURE_DIR else PACKAGED
"""The recorded answers: the shared fixture, or the package's copy of it."""

needs_fixture = pytest.mark.skipif(FIXTURE_DIR is None, reason="shared/ not beside the checkout")


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
