"""When the simulated cluster's components run: soon after a change, and at set times.

The scheduler, the kubelets and the workload controllers (``scheduling.py``,
``kubelet.py``, ``replication.py``, ``daemons.py``) are level-triggered, as their real
counterparts are: each has one synchronous ``sync`` pass that reads the whole store and
does what is due. A :class:`Wakeup` runs that pass on the event loop, soon after any
number of store changes (coalesced into one pass), and again at the earliest moment the
pass asked for (a pod due to start, a grace period running out, a heartbeat). Passes run
outside the writer's call chain, so a client's write is answered before controllers react
to it, as on a real cluster. A failing pass is logged and never raised into the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpuop_sim.apiserver import errors

logger = logging.getLogger(__name__)

DUE_EARLY = 0.002
"""Seconds early a deadline counts as due: the loop may fire a timer slightly early."""


class Wakeup:
    """Runs one component's ``sync`` pass soon, and at the earliest time it asks for."""

    def __init__(self, name: str, sync: Callable[[], None]) -> None:
        self.name = name
        self._sync = sync
        self._soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    @staticmethod
    def now() -> float:
        """The event loop's monotonic time, which :meth:`at` deadlines are expressed in."""
        return asyncio.get_running_loop().time()

    @staticmethod
    def due(deadline: float, now: float) -> bool:
        return deadline <= now + DUE_EARLY

    def soon(self) -> None:
        """Run the pass once the current callback ends; repeated calls add nothing."""
        if self._closed or self._soon is not None:
            return
        self._soon = asyncio.get_running_loop().call_soon(self._run_soon)

    def at(self, deadline: float) -> None:
        """Run the pass at loop time ``deadline``, or earlier if already asked to. Each
        pass asks again for whatever it still waits on."""
        if self._closed:
            return
        if self._timer is not None:
            if self._timer.when() <= deadline:
                return
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(deadline, self._run_timer)

    def close(self) -> None:
        self._closed = True
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()
        self._soon = self._timer = None

    def _run_soon(self) -> None:
        self._soon = None
        self._run()

    def _run_timer(self) -> None:
        self._timer = None
        self._run()

    def _run(self) -> None:
        if self._closed:
            return
        try:
            self._sync()
        except Exception:
            logger.exception("simulated %s failed", self.name)


@contextmanager
def unless_gone() -> Iterator[None]:
    """Skip a write whose object went away after the pass read it (a controller reacting
    in the same call chain may have removed it), as real controllers shrug off a 404."""
    try:
        yield
    except errors.ApiError as error:
        if error.code != 404:
            raise
