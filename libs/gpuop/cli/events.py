"""`gpuop events tail`: print stored and live events, one JSON document per line.

Reads the event stream through an ephemeral consumer (nothing is acked or changed), so it is
safe against a production bus and usable with the read-only `observer` user.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuop.bus import NatsBus
from gpuop.bus.protocol import StoredMessage
from gpuop.events import subjects

_RELATIVE = re.compile(r"^(?P<n>[0-9]+)(?P<unit>s|m|h|d)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def add_parser(verbs: Any) -> None:
    events: argparse.ArgumentParser = verbs.add_parser("events", help="read the event log")
    actions = events.add_subparsers(dest="action", required=True, metavar="ACTION")
    tail = actions.add_parser(
        "tail",
        help="print events as JSON lines",
        description="Print stored events, then follow new ones, one JSON object per line.",
    )
    tail.add_argument("--subject", help="subject filter (default <prefix>.evt.>)")
    tail.add_argument("--since", help="RFC 3339 time or a duration ago: 30s, 10m, 2h, 1d")
    tail.add_argument("--no-follow", action="store_true", help="exit after stored events")
    tail.add_argument("--nats", help="NATS URLs, comma separated (GPUOP_NATS)")
    tail.add_argument("--nats-creds", help="NATS credentials file (GPUOP_NATS_CREDS)")
    tail.add_argument("--prefix", help="subject prefix (GPUOP_PREFIX, default gpuop)")
    tail.set_defaults(handler=tail_events)


def parse_since(text: str, now: datetime) -> datetime:
    """`10m` -> ten minutes before `now`; otherwise an RFC 3339 time (UTC if no offset)."""
    match = _RELATIVE.match(text)
    if match:
        return now - timedelta(**{_UNITS[match["unit"]]: int(match["n"])})
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r}: expected RFC 3339 time or 30s/10m/2h/1d") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def render(stored: StoredMessage) -> str:
    """The stored JSON document, or, for bytes that are not JSON, a line that says so."""
    try:
        document = json.loads(stored.data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        document = {"error": "not JSON", "subject": stored.subject, "seq": stored.seq}
    return json.dumps(document, separators=(",", ":"), sort_keys=False)


async def tail_events(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    prefix = subjects.validate_prefix(args.prefix or environ.get("GPUOP_PREFIX") or "gpuop")
    urls = args.nats or environ.get("GPUOP_NATS") or "nats://127.0.0.1:4222"
    subject = args.subject or subjects.stream_filter(subjects.Kind.EVENT, prefix=prefix)
    since = parse_since(args.since, datetime.now(UTC)) if args.since else None
    bus = NatsBus(
        [u.strip() for u in urls.split(",")],
        prefix=prefix,
        creds=args.nats_creds or environ.get("GPUOP_NATS_CREDS"),
        retry_for=5.0,
    )
    await bus.connect()
    try:
        async for stored in bus.read(subject, since=since, follow=not args.no_follow):
            sys.stdout.write(render(stored) + "\n")
            sys.stdout.flush()
    finally:
        await bus.close()
    return 0
