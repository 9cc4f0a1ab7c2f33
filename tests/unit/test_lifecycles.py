"""`async with` (and `with`) over the product's resources: a closable closes, a startable
starts and stops, also when the block raises; a cluster that never formed stops the members
that started."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop import lifecycles
from gpuop.bus import launcher
from gpuop.bus.errors import BusUnavailable


class Closing(lifecycles.Closable):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def close(self) -> None:
        self.calls.append("close")


class Starting(lifecycles.Startable):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")


class Watching(lifecycles.Closing):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def close(self) -> None:
        self.calls.append("close")


def test_a_synchronous_resource_is_closed_when_its_block_ends_or_raises() -> None:
    resource = Watching()
    with resource as entered:
        assert entered is resource
        assert resource.calls == []
    assert resource.calls == ["close"]

    with pytest.raises(RuntimeError, match="body"), resource:
        raise RuntimeError("body")
    assert resource.calls == ["close", "close"]


async def test_a_closable_is_closed_when_its_block_raises_and_the_error_goes_on() -> None:
    resource = Closing()

    with pytest.raises(RuntimeError, match="body"):
        async with resource as entered:
            assert entered is resource
            assert resource.calls == []
            raise RuntimeError("body")

    assert resource.calls == ["close"]


async def test_a_startable_is_started_on_entry_and_stopped_when_its_block_raises() -> None:
    resource = Starting()

    with pytest.raises(RuntimeError, match="body"):
        async with resource as entered:
            assert entered is resource
            assert resource.calls == ["start"]
            raise RuntimeError("body")

    assert resource.calls == ["start", "stop"]


async def test_a_cluster_that_does_not_form_stops_its_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = launcher.NatsCluster(tmp_path)
    stopped: list[bool] = []

    async def start(timeout: float = 30.0) -> str:
        raise BusUnavailable("no JetStream meta leader")

    async def stop() -> None:
        stopped.append(True)

    monkeypatch.setattr(cluster, "start", start)
    monkeypatch.setattr(cluster, "stop", stop)

    with pytest.raises(BusUnavailable):
        async with cluster:
            pytest.fail("the block must not run")

    assert stopped == [True]
