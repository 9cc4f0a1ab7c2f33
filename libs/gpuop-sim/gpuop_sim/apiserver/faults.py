"""Faults the simulated API server injects on purpose: 500s, 429s and dropped watches.

A :class:`FaultPlan` given to ``ApiServer(faults=...)`` (``SimCluster(faults=...)``, or
``gpuop sim apiserver --error-rate ... --throttle-rate ... --watch-drop-seconds ...``) is
consulted by the server's middleware after authentication and before the handler runs, so a
faulted request has no effect on the cluster. It is answered, at the plan's rates:

- 500 ``InternalError``, a Status as kube-apiserver sends when storage fails;
- 429 ``TooManyRequests``, a Status with ``details.retryAfterSeconds`` and a ``Retry-After``
  header, as priority and fairness rejects a request it has no seat for.

Both are logged in ``request_log`` and counted in ``requests`` like any other answer.
Only requests whose path matches ``paths`` (by default every ``/api`` and ``/apis`` path,
never ``/healthz``, ``/livez``, ``/readyz`` or ``/version``) and whose method is in
``methods`` (by default any) are eligible; watches are requests like others.

Each open watch stream registers with the plan (``watch_opened``); while
``watch_drop_seconds`` is set, the plan ends it after a random time (exponential, of that
mean) with a clean end of the chunked response, as kube-apiserver ends a watch at its
request timeout: the client has to resume from the last resourceVersion it saw.

Tests change the plan while the server runs (``plan.error_rate = 0.1``, ``plan.off()``);
a change of ``watch_drop_seconds`` reschedules the watches already open. Decisions come
from one ``random.Random(seed)``, so a seeded plan faults the same requests of the same
sequence. ``injected`` counts the faults by status code and ``watches_dropped`` the drops.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable

from aiohttp import web

from gpuop_sim.apiserver import errors
from gpuop_sim.apiserver.handlers import json_response

API_PATHS = r"/apis?(/.*)?"
"""Every request to the API proper: discovery, resources, watches."""
THROTTLED = "Too many requests, please try again later."
"""kube-apiserver's message for a request rejected by max-in-flight or fairness."""
INJECTED = "injected by the simulated API server's fault plan"


def _rate(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be between 0 and 1 (got {value!r})")
    return float(value)


def _positive(name: str, value: float) -> float:
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive number of seconds (got {value!r})")
    return float(value)


def _seconds_header(seconds: float) -> str:
    """``1`` for whole seconds, ``0.2`` otherwise: kube-apiserver sends whole seconds only;
    fractions are a liberty of the simulator that keeps tests fast."""
    return str(int(seconds)) if seconds == int(seconds) else f"{seconds:g}"


class _OpenWatch:
    """One watch stream the plan may end."""

    def __init__(self, end: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
        self.end = end
        self.loop = loop
        self.timer: asyncio.TimerHandle | None = None


class FaultPlan:
    """What the simulated API server gets wrong, and how often; changeable at run time."""

    def __init__(
        self,
        *,
        error_rate: float = 0.0,
        throttle_rate: float = 0.0,
        retry_after: float = 1.0,
        watch_drop_seconds: float | None = None,
        paths: str = API_PATHS,
        methods: Iterable[str] | None = None,
        seed: int = 0,
    ) -> None:
        """``error_rate`` and ``throttle_rate``: the share of eligible requests answered
        500 and 429 (together at most 1). ``retry_after``: the seconds a 429 asks the client
        to wait. ``watch_drop_seconds``: the mean life of a watch before the server ends it
        (None: watches end only at their timeout). ``paths``: a regular expression the
        whole request path must match to be eligible; ``methods``: the eligible HTTP
        methods (None: all)."""
        self._rng = random.Random(seed)
        self._watches: dict[object, _OpenWatch] = {}
        self._error_rate = _rate("error_rate", error_rate)
        self._throttle_rate = 0.0
        self.throttle_rate = throttle_rate
        self.retry_after = retry_after
        self._watch_drop_seconds: float | None = None
        self.watch_drop_seconds = watch_drop_seconds
        self.paths = paths
        self.methods = methods
        self.injected: Counter[int] = Counter()
        """Faulted requests so far, by the status code they were answered with."""
        self.watches_dropped = 0
        """Watch streams the plan has ended so far."""

    @property
    def error_rate(self) -> float:
        return self._error_rate

    @error_rate.setter
    def error_rate(self, value: float) -> None:
        self._check_total(_rate("error_rate", value), self._throttle_rate)
        self._error_rate = float(value)

    @property
    def throttle_rate(self) -> float:
        return self._throttle_rate

    @throttle_rate.setter
    def throttle_rate(self, value: float) -> None:
        self._check_total(self._error_rate, _rate("throttle_rate", value))
        self._throttle_rate = float(value)

    @property
    def retry_after(self) -> float:
        return self._retry_after

    @retry_after.setter
    def retry_after(self, value: float) -> None:
        self._retry_after = _positive("retry_after", value)

    @property
    def watch_drop_seconds(self) -> float | None:
        return self._watch_drop_seconds

    @watch_drop_seconds.setter
    def watch_drop_seconds(self, value: float | None) -> None:
        seconds = None if value is None else _positive("watch_drop_seconds", value)
        self._watch_drop_seconds = seconds
        for key, watch in list(self._watches.items()):
            if not watch.loop.is_closed():
                watch.loop.call_soon_threadsafe(self._schedule, key)

    @property
    def paths(self) -> str:
        return self._paths.pattern

    @paths.setter
    def paths(self, pattern: str) -> None:
        try:
            self._paths = re.compile(pattern)
        except re.error as error:
            raise ValueError(f"paths is not a regular expression: {pattern!r}: {error}") from None

    @property
    def methods(self) -> frozenset[str] | None:
        return self._methods

    @methods.setter
    def methods(self, methods: Iterable[str] | None) -> None:
        self._methods = None if methods is None else frozenset(m.upper() for m in methods)

    @property
    def active(self) -> bool:
        """Whether the plan injects anything at all."""
        rates = self._error_rate or self._throttle_rate
        return bool(rates) or self._watch_drop_seconds is not None

    def off(self) -> None:
        """Stop injecting: no more 500s, 429s or dropped watches."""
        self.error_rate = self.throttle_rate = 0.0
        self.watch_drop_seconds = None

    def eligible(self, method: str, path: str) -> bool:
        if self._methods is not None and method.upper() not in self._methods:
            return False
        return self._paths.fullmatch(path) is not None

    def fault(self, method: str, path: str) -> web.Response | None:
        """The answer to give instead of serving this request, or None to serve it."""
        if not (self._error_rate or self._throttle_rate) or not self.eligible(method, path):
            return None
        draw = self._rng.random()
        if draw < self._error_rate:
            self.injected[500] += 1
            error = errors.internal(INJECTED)
            return json_response(error.status(), error.code)
        if draw < self._error_rate + self._throttle_rate:
            self.injected[429] += 1
            seconds = max(1, math.ceil(self._retry_after))
            throttled = errors.ApiError(
                429, "TooManyRequests", THROTTLED, details={"retryAfterSeconds": seconds}
            )
            headers = {"Retry-After": _seconds_header(self._retry_after)}
            return json_response(throttled.status(), throttled.code, headers)
        return None

    def watch_opened(self, end: Callable[[], None]) -> Callable[[], None]:
        """Register an open watch stream that ``end()`` ends cleanly; call the function
        returned once the stream is over."""
        key = object()
        self._watches[key] = _OpenWatch(end, asyncio.get_running_loop())
        self._schedule(key)
        return lambda: self._forget(key)

    def _schedule(self, key: object) -> None:
        watch = self._watches.get(key)
        if watch is None:
            return
        if watch.timer is not None:
            watch.timer.cancel()
            watch.timer = None
        if self._watch_drop_seconds is not None:
            life = self._rng.expovariate(1.0 / self._watch_drop_seconds)
            watch.timer = watch.loop.call_later(life, self._drop, key)

    def _drop(self, key: object) -> None:
        watch = self._watches.pop(key, None)
        if watch is not None:
            self.watches_dropped += 1
            watch.end()

    def _forget(self, key: object) -> None:
        watch = self._watches.pop(key, None)
        if watch is not None and watch.timer is not None:
            watch.timer.cancel()

    @staticmethod
    def _check_total(error_rate: float, throttle_rate: float) -> None:
        if error_rate + throttle_rate > 1.0:
            raise ValueError(
                f"error_rate {error_rate:g} and throttle_rate {throttle_rate:g} together exceed 1"
            )
