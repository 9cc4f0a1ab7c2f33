"""Runs one service process: logging, tracing, the bus, the health endpoints, the service.

The single path every service starts by (`gpuop run`), so a DaemonSet, a test and the demo
behave alike. SIGTERM and SIGINT stop it within seconds, also when NATS or the API server is
gone: the service gets `MAIN_GRACE` to return by itself, then is cancelled (its crash-safe
steps resume from their records and redeliveries), and closing the bus gets `CLOSE_GRACE`.
SIGUSR1 logs where each of its asyncio tasks waits (`dump_tasks`), for a process that is
alive but makes no progress.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import logging
import signal
import ssl
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from gpuop.bus import NatsBus, grants, streams
from gpuop.observability import logging as oblog
from gpuop.observability import tracing
from gpuop.observability.http import HealthServer
from gpuop.observability.metrics import BusMetrics, registry
from gpuop.observability.webconfig import WebConfig
from gpuop.runtime.services import ServiceContext, ServiceDefinition
from gpuop.runtime.settings import Role, Settings, SettingsError, load_config_file

log = logging.getLogger(__name__)

MAIN_GRACE = 2.5
"""Seconds a service has after SIGTERM or SIGINT to return by itself before it is cancelled:
a publish waiting for a NATS that is gone would otherwise wait out `--nats-wait`."""
CLOSE_GRACE = 1.5
"""Seconds closing the bus may take (a drain against a dead server times out)."""
STOP_GRACE = 60.0
"""Seconds from SIGTERM or SIGINT until a process that has still not exited is made to: its
threads' stacks go to stderr (what it hung on) and it exits 1. The last resort, for a hang
that cancelling cannot reach (a blocked thread), with the reason in its log."""


def check_role(definition: ServiceDefinition, settings: Settings) -> None:
    if settings.role not in definition.roles:
        roles = ", ".join(sorted(definition.roles))
        raise SettingsError(
            f"--role {settings.role}: {definition.name} has no {settings.role} role"
            f" (it has: {roles})"
        )


def identity(definition: ServiceDefinition, settings: Settings) -> grants.Identity:
    """Who the service is on NATS (its user in deploy/nats, and its node): its replies arrive
    on that identity's own inbox prefix, the only one its user may subscribe to."""
    if settings.role is Role.NODE:
        return grants.Identity(definition.name, settings.require_node())
    if definition.name == "upgrade-orchestrator":
        return grants.Identity(definition.name, None)
    return grants.Identity(f"{definition.name}-cluster", None)


async def run_service(definition: ServiceDefinition, settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then stop cleanly."""
    check_role(definition, settings)
    oblog.configure_logging(
        definition.name,
        node=settings.node,
        level=settings.log_level,
        json=settings.log_format == "json",
    )
    tracing.configure_tracing(definition.name, node=settings.node)
    metrics = registry()
    bus = NatsBus(
        list(settings.nats),
        prefix=settings.prefix,
        name=f"gpuop-{definition.name}-{settings.node or settings.role}",
        creds=str(settings.nats_creds) if settings.nats_creds else None,
        token_file=str(settings.nats_token_file) if settings.nats_token_file else None,
        id_key_file=str(settings.nats_id_key_file) if settings.nats_id_key_file else None,
        retry_for=settings.nats_wait,
        replicas=settings.nats_replicas,
        placement=settings.nats_placement,
        limits=streams.StoreLimits(store_bytes=settings.nats_store_bytes),
        metrics=BusMetrics(metrics),
        identity=identity(definition, settings),
    )
    context = ServiceContext(settings, bus, metrics)
    host, port = settings.listen_address
    web_config = load_web_config(settings.metrics_web_config)
    health = HealthServer(
        metrics,
        readiness=lambda: (context.ready, context.not_ready_reason),
        host=host,
        port=port,
        exposition=lambda: context.exposition() if context.exposition is not None else None,
        web_config=web_config,
    )
    loop = asyncio.get_running_loop()

    def stop() -> None:
        context.stopping.set()
        faulthandler.dump_traceback_later(STOP_GRACE, exit=True)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    address = await health.start()
    log.info("health endpoints on http://%s:%d", *address, extra={"role": settings.role})

    async def serve() -> None:
        await bus.start()
        await definition.main(context)

    try:
        await run_until_stopped(serve(), context.stopping)
    finally:
        try:
            await asyncio.wait_for(bus.close(), CLOSE_GRACE)
        except TimeoutError:
            log.warning("closing the bus took over %.1f s; left unfinished", CLOSE_GRACE)
        await health.stop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(signum)
        log.info("stopped")


async def run_until_stopped(work: Coroutine[Any, Any, None], stopping: asyncio.Event) -> None:
    """Run `work` until it returns; once `stopping` is set it has `MAIN_GRACE` seconds to
    return, then it is cancelled. Its exception, if it raised one, is raised here."""
    task: asyncio.Task[None] = asyncio.create_task(work, name="service-main")
    stopped = asyncio.create_task(stopping.wait(), name="service-stopping")
    cancelled = False
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=MAIN_GRACE)
        if not task.done():
            log.warning("still busy %.1f s after the stop signal; cancelling it", MAIN_GRACE)
            cancelled = task.cancel()
    finally:
        stopped.cancel()
        if not task.done():  # this coroutine itself was cancelled
            task.cancel()
        await asyncio.gather(task, stopped, return_exceptions=True)
    if not cancelled:
        task.result()


def dump_tasks() -> None:
    """Log every asyncio task of the running loop with the stack it waits in."""
    tasks = sorted(asyncio.all_tasks(), key=lambda task: task.get_name())
    for task in tasks:
        stack = io.StringIO()
        task.print_stack(limit=12, file=stack)
        log.warning("task dump (SIGUSR1): %s", stack.getvalue().rstrip())
    log.warning("task dump (SIGUSR1): %d tasks", len(tasks))


def load_web_config(path: Path | None) -> WebConfig | None:
    """`--metrics-web-config`, read and its TLS files loaded once now, so that a wrong file
    stops the start with exit code 2 and the flag named, not the first scrape."""
    if path is None:
        return None
    flag = "--metrics-web-config"
    config = load_config_file(path, WebConfig, flag=flag).resolved(path.parent)
    try:
        config.ssl_context()
    except (OSError, ssl.SSLError) as error:
        raise SettingsError(f"{flag} {path}: its TLS files do not load: {error}") from None
    return config
