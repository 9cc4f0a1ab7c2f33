"""`gpuop run <service>`: start one service with the flags all share (docs/operations.md)."""

from __future__ import annotations

import argparse
import faulthandler
from collections.abc import Mapping
from typing import Any

from gpuop.runtime import launching, services, settings

EXIT_GRACE = 20.0
"""Seconds a stopped service's process has to exit before it is made to."""


def add_parser(verbs: Any) -> None:
    names = ", ".join(services.names())  # not imported: a service's process imports only its own
    sub: argparse.ArgumentParser = verbs.add_parser(
        "run",
        help="run one service",
        description=f"Run one gpuop service ({names}). Every flag also reads GPUOP_<FLAG>.",
    )
    sub.add_argument("service", help="the service to run")
    sub.add_argument("--role", choices=[r.value for r in settings.Role])
    sub.add_argument("--node", help="this node's Kubernetes name (node role)")
    sub.add_argument("--nats", help="NATS URLs, comma separated")
    sub.add_argument("--nats-creds", help="NATS credentials file")
    sub.add_argument(
        "--nats-token-file", help="file with the token to connect with (callout mode), reread"
    )
    sub.add_argument(
        "--nats-id-key-file", help="key of this publisher's message ids (made when missing)"
    )
    sub.add_argument(
        "--nats-replicas",
        type=int,
        help="replicas of streams and buckets (default 1; 3 on a cluster)",
    )
    sub.add_argument(
        "--nats-placement", help="server tags for gpuop's streams, comma separated (az:east)"
    )
    sub.add_argument(
        "--nats-store-bytes",
        type=int,
        help="bytes of the account's store gpuop's streams and buckets reserve (default 6 GiB)",
    )
    sub.add_argument(
        "--nats-wait", type=float, help="seconds to keep trying NATS at start (default 30)"
    )
    sub.add_argument("--prefix", help="subject prefix (default gpuop)")
    sub.add_argument("--kubeconfig", help="kubeconfig file (cluster roles)")
    sub.add_argument("--host-root", help="host root filesystem (default /host)")
    sub.add_argument("--nvml", help="real, sim:<gpus> or recorded:<file>")
    sub.add_argument("--metrics-listen", help="HOST:PORT for /healthz, /readyz, /metrics")
    sub.add_argument(
        "--metrics-web-config",
        help="Prometheus web-config file: TLS for the endpoints, basic auth for /metrics",
    )
    sub.add_argument("--config", help="service configuration file")
    sub.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub.add_argument("--log-format", choices=["json", "text"])
    sub.set_defaults(handler=handle)


async def handle(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    definition = services.lookup(args.service)
    flags = {k: v for k, v in vars(args).items() if k not in ("verb", "handler")}
    loaded = settings.load(flags, environ)
    try:
        await launching.run_service(definition, loaded)
    finally:
        # what is left (a task that ignores cancellation, a thread) must not keep a stopped
        # service's process alive: after EXIT_GRACE its stacks go to stderr and it exits 1
        faulthandler.dump_traceback_later(EXIT_GRACE, exit=True)
    return 0
