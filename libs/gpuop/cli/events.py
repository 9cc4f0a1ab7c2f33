"""`gpuop events tail`: print stored and live events, one JSON document per line;
`gpuop events export --out FILE`: write every stored event and command as JSON lines, in
time order, for `gpuop replay` (the line format is `gpuop.saga.replaying`'s).

Both read the streams through ephemeral consumers (nothing is acked or changed), so they are
safe against a production bus and usable with the read-only `observer` user.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuop.bus import Bus, NatsBus
from gpuop.bus.protocol import StoredMessage
from gpuop.cli.verbs import add_command
from gpuop.events import MalformedMessage, SubjectMismatch, UnknownEventType, decode_on, subjects
from gpuop.saga import replaying

_RELATIVE = re.compile(r"^(?P<n>[0-9]+)(?P<unit>s|m|h|d)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def add_parser(verbs: Any) -> None:
    actions = add_command(verbs, "events", help="read the event log")
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
    export = actions.add_parser(
        "export",
        help="write the event and command log as JSON lines",
        description="Write every stored event and command, in time order, one JSON object "
        "per line: {stream, seq, subject, time, message}. `gpuop replay FILE` reads it.",
    )
    export.add_argument("--out", required=True, help="file to write ('-': standard output)")
    export.add_argument("--nats", help="NATS URLs, comma separated (GPUOP_NATS)")
    export.add_argument("--nats-creds", help="NATS credentials file (GPUOP_NATS_CREDS)")
    export.add_argument("--prefix", help="subject prefix (GPUOP_PREFIX, default gpuop)")
    export.set_defaults(handler=export_log)


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
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        document = {"error": "not JSON", "subject": stored.subject, "seq": stored.seq}
    return json.dumps(document, separators=(",", ":"), sort_keys=False)


def nats_bus(args: argparse.Namespace, environ: Mapping[str, str], prefix: str) -> NatsBus:
    """The bus `--nats` / `--nats-creds` (or GPUOP_NATS / GPUOP_NATS_CREDS) name; not
    connected yet."""
    urls = args.nats or environ.get("GPUOP_NATS") or "nats://127.0.0.1:4222"
    return NatsBus(
        [u.strip() for u in urls.split(",")],
        prefix=prefix,
        creds=args.nats_creds or environ.get("GPUOP_NATS_CREDS"),
        retry_for=5.0,
    )


def nats_prefix(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """`--prefix`, GPUOP_PREFIX or `gpuop`, checked."""
    return subjects.validate_prefix(args.prefix or environ.get("GPUOP_PREFIX") or "gpuop")


async def export_lines(bus: Bus) -> list[str]:
    """Every stored event and command of `bus` as export lines, in time order (then stream
    and sequence); a message that is not a JSON object is left out with a warning."""
    stored: list[StoredMessage] = []
    for kind in (subjects.Kind.EVENT, subjects.Kind.COMMAND):
        subject = subjects.stream_filter(kind, prefix=bus.prefix)
        stored.extend([message async for message in bus.read(subject, follow=False)])
    stored.sort(key=lambda m: (m.time, m.stream, m.seq))
    lines = []
    for message in stored:
        _warn_if_misplaced(message)
        try:
            lines.append(
                replaying.export_line(
                    message.stream, message.seq, message.subject, message.time, message.data
                )
            )
        except ValueError as exc:
            print(f"gpuop events export: skipped: {exc}", file=sys.stderr)
    return lines


def _warn_if_misplaced(message: StoredMessage) -> None:
    """Say on stderr when `message` travels on a subject its type and node do not declare
    (`check_subject`). The export keeps it, as the log holds it (the audit trail), and
    `gpuop replay` refuses a log with one."""
    try:
        decode_on(message.subject, message.data)
    except SubjectMismatch as exc:
        print(
            f"gpuop events export: {message.stream} #{message.seq} is forged or corrupt: {exc}",
            file=sys.stderr,
        )
    except (MalformedMessage, UnknownEventType):
        pass  # exported as stored; replay judges what it reads


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--out {path}: {exc}") from None


async def export_log(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    bus = nats_bus(args, environ, nats_prefix(args, environ))
    await bus.connect()
    try:
        lines = await export_lines(bus)
    finally:
        await bus.close()
    text = "".join(line + "\n" for line in lines)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        _write(args.out, text)
        print(f"exported {len(lines)} messages to {args.out}", file=sys.stderr)
    return 0


async def tail_events(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    prefix = nats_prefix(args, environ)
    subject = args.subject or subjects.stream_filter(subjects.Kind.EVENT, prefix=prefix)
    since = parse_since(args.since, datetime.now(UTC)) if args.since else None
    bus = nats_bus(args, environ, prefix)
    await bus.connect()
    try:
        async for stored in bus.read(subject, since=since, follow=not args.no_follow):
            sys.stdout.write(render(stored) + "\n")
            sys.stdout.flush()
    finally:
        await bus.close()
    return 0
