"""Leader election: only the replica holding the Lease decides.

`lead` runs a `LeaderElection` on the configured Lease and, each time this replica becomes
leader, runs a fresh `Controller` until leadership is lost or the service stops; a replica
that is not leader only waits. A takeover needs nothing from the previous leader: the sagas
are in KV, the intake consumer is durable, and `Runner.resume` re-issues pending steps.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpuop.bus import Bus
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import client
from gpuop.kube.leases import LeaderElection
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.controller import Controller

log = logging.getLogger(__name__)


def election(
    kube: client.Kube, config: OrchestratorConfig, *, identity: str | None = None
) -> LeaderElection:
    """The Lease candidate for this replica, with renewal periods scaled to the duration."""
    duration = config.lease_duration_seconds
    return LeaderElection(
        kube,
        config.lease_name,
        namespace=config.lease_namespace,
        identity=identity,
        lease_duration=duration,
        renew_deadline=duration * 2 / 3,
        retry_period=duration / 5,
    )


async def _first(*events: asyncio.Event, task: asyncio.Task[None] | None = None) -> None:
    """Return once any of `events` is set (or `task` ended)."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    watched: list[asyncio.Task[Any]] = [*waits, *([task] if task is not None else [])]
    try:
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def _stop(task: asyncio.Task[None]) -> BaseException | None:
    """Cancel `task` until it ends (a library may swallow one cancel, see
    `controller._raise_if_cancelled`); returns the exception it failed with, if any."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
    if task.cancelled():
        return None
    return task.exception()


async def lead(
    bus: Bus,
    kube: client.Kube,
    config: OrchestratorConfig,
    stopping: asyncio.Event,
    *,
    identity: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
    retry_delay: float = 2.0,
) -> None:
    """Campaign for the Lease and lead whenever holding it, until `stopping` is set; a
    controller that fails is started again after `retry_delay` while still leading."""
    candidate = election(kube, config, identity=identity)
    campaign = asyncio.create_task(candidate.run(), name="lease-campaign")
    try:
        while not stopping.is_set():
            await _first(candidate.leading_event, stopping)
            if stopping.is_set():
                break
            log.info("leading as %s", candidate.identity)
            controller = Controller(bus, kube, config, clock=clock)
            leading = asyncio.create_task(controller.run(), name="upgrade-controller")
            try:
                await _first(candidate.following_event, stopping, task=leading)
            finally:
                outcome = await _stop(leading)
            if isinstance(outcome, Exception):
                # leading again starts over from KV, which is always safe
                log.error("the controller failed; starting it again", exc_info=outcome)
                await clock.sleep(retry_delay)
            if not stopping.is_set() and not candidate.is_leader:
                log.warning("lost the lease; waiting to lead again")
    finally:
        failure = await _stop(campaign)
        if failure is not None:
            log.error("the lease campaign failed", exc_info=failure)
