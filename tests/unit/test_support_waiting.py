"""`eventually`, the one way a test waits: it returns the first true answer, and fails on time
even when the check itself hangs."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.waiting import eventually


async def test_returns_the_first_answer_that_is_neither_none_nor_false() -> None:
    answers = iter([None, False, 0, "found"])
    assert await eventually(lambda: next(answers), timeout=1, interval=0) == 0


async def test_an_async_check_is_awaited() -> None:
    calls = []

    async def check() -> bool:
        calls.append(1)
        return len(calls) == 3

    assert await eventually(check, timeout=1, interval=0) is True
    assert len(calls) == 3


async def test_a_check_never_true_fails_with_its_name() -> None:
    def never() -> bool:
        return False

    with pytest.raises(TimeoutError, match=r"never not true within 0\.05 s"):
        await eventually(never, timeout=0.05)


async def test_a_check_that_hangs_fails_on_time() -> None:
    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    with pytest.raises(TimeoutError, match="the check hung"):
        await eventually(hangs, timeout=0.05)
