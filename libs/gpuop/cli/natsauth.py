"""`gpuop nats-auth`: the NATS auth callout of callout mode (deploy/nats/callout.conf).

Connects to NATS as the callout's own user (`nats-auth`, in the AUTH account), answers the
server's authorization requests (`gpuop.bus.callouts`) with users signed by the issuer seed,
and has each client's token reviewed by the Kubernetes API server (`gpuop.kube.tokenreviews`)
as the pod's ServiceAccount, which may `create` `tokenreviews` and nothing else. Runs until
SIGTERM or SIGINT; the chart runs two replicas, which share the requests (a queue group).
`/healthz`, `/readyz` (ready while connected to NATS) and `/metrics`
(`gpuop_nats_auth_decisions_total` by reason) are on `--metrics-listen`, with
GPUOP_METRICS_WEB_CONFIG's TLS and basic auth as every service's.

Settings come from flags or their variables: `--nats` (GPUOP_NATS, with the callout user's
password in the URL), `--issuer-seed-file` (GPUOP_NATS_AUTH_ISSUER_SEED_FILE, the account seed
`SA...`, or the PKCS#8 Ed25519 PEM the chart generates, whose public key is callout.conf's
issuer; during a rotation the old and the new key's files, separated by commas),
`--account NAMESPACE/SERVICEACCOUNT=ROLE`
(GPUOP_NATS_AUTH_ACCOUNTS, comma separated: which ServiceAccount is which gpuop role),
`--max-lifetime` (seconds a user lives at most; the token's expiry comes first).

`--issuer-config FILE` writes the public key of the first issuer file as the include the
chart's callout.conf reads in `auth_callout` (`issuer: "A..."`) and exits: the bundled NATS
runs it in an init container, since Helm can generate an Ed25519 key but not write its nkey.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nats
import nats.errors
from prometheus_client import CollectorRegistry

from gpuop.bus import callouts, nkeys, reviewers
from gpuop.bus.errors import BusUnavailable
from gpuop.events import subjects
from gpuop.kube import client as kubeclient
from gpuop.kube.tokenreviews import AUDIENCE, KubeTokenReviewer
from gpuop.observability import logging as oblog
from gpuop.observability.http import HealthServer
from gpuop.observability.redaction import redacted
from gpuop.runtime import launching

log = logging.getLogger(__name__)


def add_parser(verbs: Any) -> None:
    command: argparse.ArgumentParser = verbs.add_parser(
        "nats-auth",
        help="run the NATS auth callout (callout mode: per-node NATS users)",
        description="Answer nats-server's authorization requests: review each client's "
        "Kubernetes token and admit it as the gpuop role of its ServiceAccount, for its "
        "pod's node only, until the token expires.",
    )
    command.add_argument("--nats", help="NATS URLs with the nats-auth user (GPUOP_NATS)")
    command.add_argument(
        "--issuer-seed-file",
        help="file holding the issuer account key, a seed SA... or an Ed25519 PKCS#8 PEM; "
        "several separated by commas while the server's issuer changes "
        "(GPUOP_NATS_AUTH_ISSUER_SEED_FILE)",
    )
    command.add_argument(
        "--issuer-config",
        metavar="FILE",
        help="write the first issuer key's public key as callout.conf's issuer include "
        '(issuer: "A...") to FILE and exit',
    )
    command.add_argument(
        "--account",
        action="append",
        metavar="NAMESPACE/SERVICEACCOUNT=ROLE",
        help="a ServiceAccount and the gpuop role it connects as; repeat for each "
        "(GPUOP_NATS_AUTH_ACCOUNTS, comma separated)",
    )
    command.add_argument("--audience", help=f"the tokens' audience (default {AUDIENCE})")
    command.add_argument(
        "--max-lifetime",
        type=float,
        help="seconds a NATS user lives at most (GPUOP_NATS_AUTH_MAX_LIFETIME, default 3600)",
    )
    command.add_argument("--kubeconfig", help="kubeconfig (default: the pod's ServiceAccount)")
    command.add_argument("--prefix", help="subject prefix (GPUOP_PREFIX, default gpuop)")
    command.add_argument(
        "--metrics-listen",
        help="HOST:PORT of /healthz, /readyz, /metrics (GPUOP_METRICS_LISTEN, 127.0.0.1:0)",
    )
    command.add_argument(
        "--new-issuer-secret",
        metavar="NAME",
        help="print a Secret NAME with a new issuer key (seed and issuer) and exit: the "
        "chart's nats.auth.callout.issuerSecret",
    )
    command.add_argument("--namespace", help="the namespace of --new-issuer-secret")
    command.set_defaults(handler=nats_auth_command)


def issuer_secret(name: str, namespace: str | None) -> str:
    """A Secret manifest with a new issuer account key: `seed` for the callout, `issuer` (its
    public key) for the server's callout.conf."""
    issuer = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    metadata: dict[str, str] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": {"seed": issuer.seed, "issuer": issuer.public_key},
    }
    return json.dumps(secret, indent=2)


def _setting(value: str | None, environ: Mapping[str, str], variable: str, default: str) -> str:
    return value or environ.get(variable) or default


def issuer_from(path: str) -> nkeys.KeyPair:
    """The issuer key in `path`, a seed or a PEM (the chart's generated key); a ValueError
    that names the file when it is neither."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        shown = exc.strerror if isinstance(exc, OSError) else "not text"
        raise ValueError(f"--issuer-seed-file {path}: {shown or exc}") from None
    try:
        if text.lstrip().startswith("-----BEGIN"):
            issuer = nkeys.KeyPair.from_pem(text, nkeys.Kind.ACCOUNT)
        else:
            issuer = nkeys.KeyPair.from_seed(text.strip())
    except nkeys.NkeyError as exc:
        raise ValueError(f"--issuer-seed-file {path}: {exc}") from None
    if issuer.kind is not nkeys.Kind.ACCOUNT:
        raise ValueError(
            f"--issuer-seed-file {path}: an account seed (SA...) is needed, not a"
            f" {issuer.kind.name.lower()} seed"
        )
    return issuer


def issuer_config(issuer: nkeys.KeyPair) -> str:
    """The include that callout.conf's `auth_callout` reads in the chart (in place of
    `issuer: $NATS_AUTH_ISSUER`): the issuer's public key, nothing secret."""
    return (
        "# written by `gpuop nats-auth --issuer-config` from the issuer key's Secret\n"
        f'issuer: "{issuer.public_key}"\n'
    )


def write_issuer_config(path: Path, issuer: nkeys.KeyPair) -> None:
    path.write_text(issuer_config(issuer), encoding="utf-8")


def accounts_from(args: argparse.Namespace, environ: Mapping[str, str]) -> callouts.Accounts:
    entries = list(args.account or [])
    if not entries:
        listed = environ.get("GPUOP_NATS_AUTH_ACCOUNTS", "")
        entries = [entry.strip() for entry in listed.split(",") if entry.strip()]
    if not entries:
        raise ValueError("--account: name at least one NAMESPACE/SERVICEACCOUNT=ROLE")
    return callouts.Accounts.parse(entries)


async def nats_auth_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.new_issuer_secret:
        print(issuer_secret(args.new_issuer_secret, args.namespace))
        return 0
    seed_file = _setting(args.issuer_seed_file, environ, "GPUOP_NATS_AUTH_ISSUER_SEED_FILE", "")
    # several files while the issuer changes: the first is the current key
    issuer = [issuer_from(path.strip()) for path in seed_file.split(",") if path.strip()]
    if not issuer:
        raise ValueError("--issuer-seed-file is required")
    if args.issuer_config:
        write_issuer_config(Path(args.issuer_config), issuer[0])
        return 0
    accounts = accounts_from(args, environ)
    prefix = subjects.validate_prefix(_setting(args.prefix, environ, "GPUOP_PREFIX", "gpuop"))
    lifetime = args.max_lifetime or float(environ.get("GPUOP_NATS_AUTH_MAX_LIFETIME", "3600"))
    if not 60 <= lifetime <= 86400:
        raise ValueError(f"--max-lifetime {lifetime:g}: expected 60 to 86400 seconds")
    servers = _setting(args.nats, environ, "GPUOP_NATS", "nats://127.0.0.1:4222").split(",")
    listen = _setting(args.metrics_listen, environ, "GPUOP_METRICS_LISTEN", "127.0.0.1:0")
    host, _, port = listen.rpartition(":")
    web_config_file = environ.get("GPUOP_METRICS_WEB_CONFIG")
    web_config = launching.load_web_config(Path(web_config_file)) if web_config_file else None
    oblog.configure_logging(
        "nats-auth",
        level=environ.get("GPUOP_LOG_LEVEL", "INFO"),
        json=environ.get("GPUOP_LOG_FORMAT", "json") == "json",
    )

    registry = CollectorRegistry()
    kube = await kubeclient.connect(args.kubeconfig or environ.get("GPUOP_KUBECONFIG"))
    # a restarted server's clients all reconnect at once: one review per token, not per try
    reviewer = reviewers.CachingReviewer(
        KubeTokenReviewer(kube, audience=args.audience or AUDIENCE)
    )
    authorizer = callouts.Authorizer(
        issuer,
        reviewer,
        accounts,
        prefix=prefix,
        max_lifetime=lifetime,
        metrics=callouts.CalloutMetrics(registry),
    )
    try:
        nc = await nats.connect(
            [server.strip() for server in servers],
            name="gpuop-nats-auth",
            max_reconnect_attempts=-1,
            connect_timeout=5,
        )
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        await kube.close()
        shown = ", ".join(redacted(server) for server in servers)
        raise BusUnavailable(f"cannot connect to {shown}: {exc!r}") from exc
    health = HealthServer(
        registry,
        readiness=lambda: (nc.is_connected, "" if nc.is_connected else "not connected to NATS"),
        host=host.strip("[]"),
        port=int(port),
        web_config=web_config,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await health.start()
    try:
        await callouts.serve(nc, authorizer, stopping)
    finally:
        await nc.close()
        await kube.close()
        await health.stop()
    return 0
