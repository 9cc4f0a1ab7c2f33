"""`gpuop bus backup DIR`: snapshot every stream and bucket of the prefix into DIR;
`gpuop bus restore DIR [--force] [--replicas N]`: recreate them from it on another (or the
same) NATS, with their sequences, KV revisions and consumers (`gpuop.bus.backup`).

Both print one line per stream: its name, messages and bytes. Bad input (no such DIR, no or a
corrupt manifest, a file whose checksum differs, DIR not empty for a backup) exits 2; a
server that lacks a stream, or already has one to restore (without --force), exits 1, and
nothing was written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from gpuop.bus import backup as backups
from gpuop.cli.events import nats_prefix
from gpuop.cli.verbs import add_command


def add_parser(verbs: Any) -> None:
    actions = add_command(verbs, "bus", help="back up and restore the streams and buckets")
    backup = actions.add_parser(
        "backup",
        help="snapshot every stream and bucket into DIR",
        description="Snapshot the streams (events, commands, dead letters) and the KV "
        "buckets (sagas, nodes, config, ipam) of the prefix into DIR, which must be absent "
        "or empty: one <stream>.tar.s2 and <stream>.json each, and manifest.json.",
    )
    backup.add_argument("dir", metavar="DIR", help="directory to write (created)")
    _connection_flags(backup)
    backup.set_defaults(handler=backup_command)
    restore = actions.add_parser(
        "restore",
        help="recreate the streams and buckets of a backup",
        description="Recreate every stream and bucket of the backup in DIR, with the same "
        "sequence numbers, KV revisions and durable consumers. Checks every file against the "
        "manifest first, and refuses streams that exist unless --force.",
    )
    restore.add_argument("dir", metavar="DIR", help="directory `gpuop bus backup` wrote")
    restore.add_argument(
        "--force",
        action="store_true",
        help="delete the streams of the backup that exist on the server first (their "
        "contents are lost)",
    )
    restore.add_argument(
        "--replicas",
        type=_replicas,
        metavar="N",
        help="replicas of every restored stream (default: as backed up)",
    )
    _connection_flags(restore)
    restore.set_defaults(handler=restore_command)


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats", help="NATS URLs, comma separated (GPUOP_NATS)")
    parser.add_argument("--nats-creds", help="NATS credentials file (GPUOP_NATS_CREDS)")
    parser.add_argument("--prefix", help="subject prefix (GPUOP_PREFIX, default gpuop)")


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of replicas, got {text!r}") from None
    if not 1 <= value <= 5:
        raise argparse.ArgumentTypeError("JetStream keeps 1 to 5 replicas")
    return value


def _servers(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    urls = args.nats or environ.get("GPUOP_NATS") or "nats://127.0.0.1:4222"
    return [url.strip() for url in urls.split(",")]


def _creds(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    return args.nats_creds or environ.get("GPUOP_NATS_CREDS") or None


def _print(manifest: backups.Manifest) -> None:
    for entry in manifest.streams:
        print(f"{entry.name:<24} {entry.messages:>10} messages {entry.bytes:>14} bytes")


async def backup_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    prefix = nats_prefix(args, environ)
    nc = await backups.connect(_servers(args, environ), _creds(args, environ))
    try:
        manifest = await backups.backup(nc, prefix, args.dir)
    finally:
        await nc.close()
    _print(manifest)
    print(f"backed up {len(manifest.streams)} streams to {args.dir}", file=sys.stderr)
    return 0


async def restore_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    prefix = nats_prefix(args, environ)
    backups.read_manifest(args.dir)  # a bad directory is refused before connecting
    nc = await backups.connect(_servers(args, environ), _creds(args, environ))
    try:
        manifest = await backups.restore(
            nc, prefix, args.dir, replicas=args.replicas, force=args.force
        )
    finally:
        await nc.close()
    _print(manifest)
    print(f"restored {len(manifest.streams)} streams from {args.dir}", file=sys.stderr)
    return 0
