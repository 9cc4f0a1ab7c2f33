"""`RetryPolicy`: which failures `Kube.call` retries, for which verbs, after how long; and
the verb of every API method, read from its name, against the official client's own."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from kubernetes.aio import client as k8s

from gpuop.kube import client, errors

POLICY = client.RetryPolicy()
THROTTLED = errors.from_status(429, {"reason": "TooManyRequests"}, retry_after=1.0)
UNAVAILABLE = errors.from_status(503, {"reason": "ServiceUnavailable"}, retry_after=2.0)
INTERNAL = errors.from_status(500, {"reason": "InternalError"})
BUDGET = errors.from_status(429, {"reason": "TooManyRequests", "details": {"causes": []}})
REFUSED = errors.unreachable(ConnectionRefusedError(), sent=False)
RESET = errors.unreachable(ConnectionResetError())


@pytest.mark.parametrize(
    ("error", "read", "delay"),
    [
        (THROTTLED, True, 1.0),
        (THROTTLED, False, 1.0),  # refused before it ran: safe for any verb
        (UNAVAILABLE, False, 2.0),  # the server asked to come back, as client-go honours
        (BUDGET, True, None),  # no Retry-After: an eviction refused, not a throttle
        (BUDGET, False, None),
        (errors.from_status(404, {"reason": "NotFound"}), True, None),
        (errors.from_status(409, {"reason": "Conflict"}), False, None),
        (errors.from_status(410, {"reason": "Expired"}), True, None),
    ],
)
def test_what_is_retried_after_a_fixed_delay_or_not_at_all(
    error: errors.KubeError, read: bool, delay: float | None
) -> None:
    assert POLICY.delay(error, read=read, retry=1) == delay


@pytest.mark.parametrize(
    ("error", "read", "retried"),
    [
        (INTERNAL, True, True),
        (INTERNAL, False, False),  # the write may have run
        (RESET, True, True),
        (RESET, False, False),  # sent, then lost: it may have run
        (REFUSED, False, True),  # never sent
    ],
)
def test_what_is_retried_with_backoff(error: errors.KubeError, read: bool, retried: bool) -> None:
    delay = POLICY.delay(error, read=read, retry=1)

    assert (delay is not None) is retried
    if delay is not None:
        assert POLICY.backoff / 2 <= delay <= POLICY.backoff


def test_backoff_doubles_up_to_the_longest_wait_and_stops_after_the_attempts() -> None:
    policy = client.RetryPolicy(attempts=10, backoff=1.0, max_delay=4.0)

    delays = [policy.delay(INTERNAL, read=True, retry=retry) for retry in range(1, 11)]

    bounds = [1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(
        delay is not None and bound / 2 <= delay <= bound
        for delay, bound in zip(delays, bounds, strict=False)
    )
    assert delays[-1] is None
    assert client.NO_RETRY.delay(THROTTLED, read=True, retry=1) is None


def _verbs(api: type) -> dict[str, str]:
    """Method name -> the HTTP verb its request serializer uses, from the client's source
    (one API class per module)."""
    source = Path(inspect.getfile(api)).read_text(encoding="utf-8")
    serializers = re.split(r"\n    (?:async )?def _", source)
    found: dict[str, str] = {}
    for serializer in serializers:
        named = re.match(r"(\w+)_serialize\(", serializer)
        verb = re.search(r"method='(\w+)'", serializer)
        if named and verb:
            found[named.group(1)] = verb.group(1)
    return found


@pytest.mark.parametrize(
    "api",
    [
        k8s.CoreV1Api,
        k8s.CoordinationV1Api,
        k8s.PolicyV1Api,
        k8s.CustomObjectsApi,
        k8s.ApiextensionsV1Api,
        k8s.AppsV1Api,
    ],
)
def test_the_verb_read_from_a_method_name_is_the_one_the_client_sends(api: type) -> None:
    verbs = _verbs(api)
    instance = api(object())

    assert len(verbs) > 5
    for name, verb in verbs.items():
        method = getattr(instance, name)
        assert client.is_read(method) is (verb in ("GET", "HEAD")), (name, verb)
        raw = getattr(instance, f"{name}_without_preload_content")
        assert client.is_read(raw) is client.is_read(method)
