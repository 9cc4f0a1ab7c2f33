"""Unit tests run in memory and finish in well under a second each: one that takes more than
`UNIT_TIMEOUT` seconds is hung, and fails with the stacks of where it waits. A test that
needs longer (building a wheel) says so with its own `timeout` mark."""

from __future__ import annotations

import pytest

UNIT_TIMEOUT = 15


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None and "tests/unit/" in item.nodeid:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT))
