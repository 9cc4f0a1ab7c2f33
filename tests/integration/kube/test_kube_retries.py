"""`Kube.call` against a server that fails on purpose (`gpuop_sim.apiserver.faults`): what it
retries, how long it waits (on a virtual clock), and when it gives the error to the caller."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.clocks import VirtualClock
from gpuop.kube import client, errors, nodes
from gpuop_sim import ApiServer
from tests.support import kube_objects as support

NAMESPACES = "/api/v1/namespaces"


class RecoveringClock(VirtualClock):
    """Virtual time that records every wait; the server's faults stop after `faulty` waits
    (never, when None), as a server that recovers while the client waits."""

    def __init__(self, server: ApiServer, faulty: int | None = None) -> None:
        super().__init__()
        self.server = server
        self.faulty = faulty
        self.waits: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.faulty is not None and len(self.waits) >= self.faulty:
            self.server.faults.off()
        await super().sleep(seconds)


def namespace(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def answers(server: ApiServer, path: str) -> list[tuple[str, int]]:
    return [(r.method, r.status) for r in server.request_log if r.path == path]


async def test_a_throttled_write_is_retried_after_the_retry_after_it_was_given(
    server: ApiServer, kube: client.Kube
) -> None:
    server.faults.throttle_rate, server.faults.retry_after = 1.0, 0.5
    kube.clock = clock = RecoveringClock(server, faulty=2)

    created = await kube.call(kube.core.create_namespace, namespace("gpu"))

    assert created["metadata"]["name"] == "gpu"
    assert clock.waits == [0.5, 0.5]
    assert answers(server, NAMESPACES) == [("POST", 429), ("POST", 429), ("POST", 201)]


async def test_a_read_that_got_a_500_is_retried_with_growing_jittered_backoff(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))
    server.faults.error_rate = 1.0
    kube.clock = clock = RecoveringClock(server, faulty=3)

    node = await nodes.get(kube, "node-1")

    assert node["metadata"]["name"] == "node-1"
    assert [status for _, status in answers(server, "/api/v1/nodes/node-1")] == [500] * 3 + [200]
    first, second, third = clock.waits
    assert 0.05 <= first <= 0.1
    assert 0.1 <= second <= 0.2
    assert 0.2 <= third <= 0.4


async def test_a_write_that_got_a_500_is_not_retried(server: ApiServer, kube: client.Kube) -> None:
    server.faults.error_rate = 1.0
    kube.clock = clock = RecoveringClock(server)

    with pytest.raises(errors.ServerError) as raised:
        await kube.call(kube.core.create_namespace, namespace("gpu"))

    assert raised.value.code == 500
    assert raised.value.reason == "InternalError"
    assert clock.waits == []
    assert answers(server, NAMESPACES) == [("POST", 500)]


@pytest.mark.parametrize(
    ("fault", "raised_type"),
    [("error_rate", errors.ServerError), ("throttle_rate", errors.TooManyRequests)],
)
async def test_a_read_gives_up_after_the_attempts_with_the_last_error(
    server: ApiServer, kube: client.Kube, fault: str, raised_type: type[errors.KubeError]
) -> None:
    setattr(server.faults, fault, 1.0)
    kube.clock = clock = RecoveringClock(server)

    with pytest.raises(raised_type):
        await kube.call(kube.core.list_node)

    assert len(answers(server, "/api/v1/nodes")) == kube.retry.attempts == 5
    assert len(clock.waits) == 4


async def test_retries_end_at_the_calls_request_timeout(
    server: ApiServer, kube: client.Kube
) -> None:
    server.faults.throttle_rate, server.faults.retry_after = 1.0, 0.6
    kube.clock = clock = RecoveringClock(server)

    with pytest.raises(errors.TooManyRequests):
        await kube.call(kube.core.list_node, _request_timeout=1.0)

    assert clock.waits == [0.6]  # a second wait would end past the second the call has
    assert len(answers(server, "/api/v1/nodes")) == 2


async def test_a_retry_after_longer_than_the_longest_wait_is_the_callers(
    server: ApiServer, kube: client.Kube
) -> None:
    server.faults.throttle_rate, server.faults.retry_after = 1.0, 10
    kube.clock = clock = RecoveringClock(server)

    with pytest.raises(errors.TooManyRequests) as raised:
        await kube.call(kube.core.list_node)

    assert raised.value.retry_after == 10
    assert clock.waits == []


async def test_no_retry_sends_every_failure_to_the_caller(
    server: ApiServer, kube: client.Kube
) -> None:
    server.faults.throttle_rate = 1.0
    kube.clock = clock = RecoveringClock(server)
    kube.retry = client.NO_RETRY

    with pytest.raises(errors.TooManyRequests):
        await kube.call(kube.core.list_node)

    assert clock.waits == []


async def test_a_write_to_a_server_that_refuses_connections_is_retried_as_it_never_ran(
    tmp_path: Path,
) -> None:
    async with ApiServer() as stopped:
        kubeconfig = stopped.write_kubeconfig(tmp_path / "kubeconfig")
    clock = VirtualClock()

    async with await client.connect(kubeconfig) as kube:
        kube.clock = clock
        with pytest.raises(errors.Unreachable) as raised:
            await kube.call(kube.core.create_namespace, namespace("gpu"))

    assert raised.value.sent is False
    assert clock.monotonic() > 0  # it waited before each of its retries
