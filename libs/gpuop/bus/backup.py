"""Backup and restore of every stream and bucket of one prefix, on JetStream's own snapshot
and restore API (`gpuop bus backup DIR`, `gpuop bus restore DIR`).

A backup directory holds, per stream (`GPUOP_EVENTS`, `GPUOP_COMMANDS`, `GPUOP_DLQ` and the
buckets' `KV_gpuop_*`):

    <stream>.tar.s2   the server's snapshot, as it sent it (an S2-compressed tar of the
                      stream's store: messages with their sequences, headers and times,
                      and its durable consumers)
    <stream>.json     {"config", "state"} as the snapshot answer gave them (what a restore
                      sends back), and "info", the stream's info read just before

and `manifest.json` (`Manifest`), written last: a directory without one is not a backup.

The protocol, over the core client (nats-py has no helper for it):

    snapshot  request $JS.API.STREAM.SNAPSHOT.<stream> {"deliver_subject", "chunk_size",
              "no_consumers"}; the answer carries the stream's config and state at the
              snapshot. The chunks then arrive on deliver_subject; a chunk with a reply
              subject asks for an (empty) answer, the server's flow control, and stops the
              transfer after a few seconds without one; the last chunk has no reply subject.
              The end is a message with no data; newer servers give it a status header:
              204 when complete, another (408 "No Interest", ...) when they gave up.
    restore   request $JS.API.STREAM.RESTORE.<stream> {"config", "state"}; the answer names a
              deliver_subject. Each chunk is sent there as a request, answered empty (a
              non-empty answer is an error); an empty request ends the transfer and is
              answered, once the server rebuilt the stream, with a stream create response:
              the restored stream's info, or the error. The server refuses a stream that
              exists, and gives up on a restore that sends nothing for five seconds.

Sequences, message headers (`Nats-Msg-Id` among them) and KV revisions come back as they
were; so do durable consumers and their positions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import nats
import nats.errors
from nats.aio.client import Client
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import gpuop
from gpuop.bus import streams
from gpuop.bus.errors import BusError, BusUnavailable
from gpuop.bus.protocol import Buckets
from gpuop.observability.redaction import redacted

MANIFEST = "manifest.json"
FORMAT = 1
"""Version of the directory layout; a restore refuses one it does not know."""
SNAPSHOT_CHUNK = 128 * 1024
"""Bytes per chunk the server is asked to send."""
RESTORE_CHUNK = 128 * 1024
DELIVER_INTEREST_SECONDS = 5.0
"""How long a restore waits for the server's chunk subscription to be known where it is
connected: in a cluster the stream's leader may sit on another server, whose interest in the
deliver subject reaches this one a moment after it answered (until then a chunk has no
responders, so nobody received it and it is sent again)."""
"""Bytes per chunk sent to the server (at most its max_payload)."""
TIMEOUT = 30.0
"""Seconds to wait for one answer of the server, or for its next chunk."""
FINISH_TIMEOUT = 600.0
"""Seconds the server may take to rebuild a restored stream from its snapshot."""
STREAM_NOT_FOUND = 10059
"""JetStream's err_code for a stream that does not exist."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


class BackupInvalid(ValueError):
    """A backup directory that cannot be used: missing, not empty (for a backup), without a
    readable manifest, or with a file whose size or checksum differs from the manifest's."""


class StreamMissing(BusError):
    """The server lacks a stream the backup must hold."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(
            f"stream{'s' if len(names) > 1 else ''} {', '.join(names)} not found on the "
            "server: nothing was backed up (is --prefix right? every gpuop service creates "
            "all streams and buckets when it starts)"
        )
        self.names = tuple(names)


class StreamExists(BusError):
    """A restore whose streams already exist on the server (without `force`)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(
            f"stream{'s' if len(names) > 1 else ''} {', '.join(names)} already exist"
            f"{'s' if len(names) == 1 else ''} on the server: nothing was restored "
            "(--force deletes them first, and everything they hold)"
        )
        self.names = tuple(names)


class StreamEntry(BaseModel):
    """One stream of a backup, as the snapshot saw it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME.pattern)
    messages: int = Field(ge=0)
    bytes: int = Field(ge=0)
    first_seq: int = Field(ge=0)
    last_seq: int = Field(ge=0)
    snapshot_size: int = Field(ge=0)
    """Bytes of `<name>.tar.s2`."""
    sha256: str = Field(pattern="^[0-9a-f]{64}$")
    """Of `<name>.tar.s2`."""
    meta_sha256: str = Field(pattern="^[0-9a-f]{64}$")
    """Of `<name>.json`."""

    @property
    def snapshot_file(self) -> str:
        return f"{self.name}.tar.s2"

    @property
    def meta_file(self) -> str:
        return f"{self.name}.json"


class Manifest(BaseModel):
    """`manifest.json`: what a backup holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int
    gpuop_version: str
    prefix: str
    created: datetime
    server_version: str
    streams: tuple[StreamEntry, ...]


def stream_names(prefix: str) -> list[str]:
    """Every stream gpuop keeps for `prefix`: the three streams, then the buckets'."""
    names = [layout.name for layout in streams.layouts(prefix)]
    return names + [f"KV_{streams.bucket_name(prefix, bucket)}" for bucket in Buckets]


async def connect(servers: Sequence[str], creds: str | None = None, *, wait: float = 2.0) -> Client:
    """A core connection for `backup` and `restore`; `BusUnavailable` when none is made
    within about `wait` seconds."""

    async def quiet(exc: Exception) -> None:
        return None

    try:
        return await nats.connect(
            servers=list(servers),
            name="gpuop-bus-backup",
            user_credentials=creds,
            connect_timeout=2,
            max_reconnect_attempts=max(1, int(wait / 0.25)),
            reconnect_time_wait=0.25,
            error_cb=quiet,
        )
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        shown = ", ".join(redacted(server) for server in servers)
        raise BusUnavailable(f"cannot connect to {shown}: {exc!r}") from exc


# backup


async def backup(
    nc: Client,
    prefix: str,
    directory: Path | str,
    *,
    chunk_size: int = SNAPSHOT_CHUNK,
    timeout: float = TIMEOUT,
) -> Manifest:
    """Snapshot every stream of `prefix` into `directory` (created; it must be absent or
    empty). `StreamMissing` names the streams the server lacks before anything is written;
    a backup that fails leaves the directory as it found it."""
    directory = Path(directory)
    names = stream_names(prefix)
    infos: dict[str, dict[str, Any]] = {}
    missing = []
    for name in names:
        info = await _stream_info(nc, name, timeout)
        if info is None:
            missing.append(name)
        else:
            infos[name] = info
    if missing:
        raise StreamMissing(missing)
    created = _prepare(directory)
    written: list[Path] = []
    try:
        entries = [
            await _snapshot(nc, name, infos[name], directory, written, chunk_size, timeout)
            for name in names
        ]
        manifest = Manifest(
            format=FORMAT,
            gpuop_version=gpuop.__version__,
            prefix=prefix,
            created=datetime.now(UTC),
            server_version=_server_version(nc),
            streams=tuple(entries),
        )
        _write_atomically(directory / MANIFEST, manifest.model_dump_json(indent=2).encode())
    except BaseException:
        for path in written:
            for leftover in (path, path.with_name(path.name + ".partial")):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    return manifest


def _prepare(directory: Path) -> bool:
    """Make `directory` ready for a backup; True when it was created here."""
    if directory.exists() and not directory.is_dir():
        raise BackupInvalid(f"{directory} is not a directory")
    if directory.is_dir():
        if any(directory.iterdir()):
            raise BackupInvalid(f"{directory} is not empty: back up into a new directory")
        return False
    try:
        directory.mkdir(parents=True)
    except OSError as exc:
        raise BackupInvalid(f"cannot create {directory}: {exc}") from None
    return True


async def _snapshot(
    nc: Client,
    name: str,
    info: dict[str, Any],
    directory: Path,
    written: list[Path],
    chunk_size: int,
    timeout: float,
) -> StreamEntry:
    inbox = nc.new_inbox()
    # subscribed before asking: the server starts sending as soon as it has answered
    subscription = await nc.subscribe(inbox, pending_bytes_limit=256 * 1024 * 1024)
    path = directory / f"{name}.tar.s2"
    try:
        answer = await _api(
            nc,
            f"$JS.API.STREAM.SNAPSHOT.{name}",
            {"deliver_subject": inbox, "chunk_size": chunk_size, "no_consumers": False},
            timeout,
        )
        _raise_for(answer, f"snapshot of {name}")
        digest, size = hashlib.sha256(), 0
        written.append(path)
        with _create(path) as out:
            while True:
                try:
                    chunk = await subscription.next_msg(timeout=timeout)
                except (TimeoutError, nats.errors.TimeoutError):
                    raise BusError(
                        f"snapshot of {name}: no chunk from the server for {timeout:g} s "
                        f"after {size} bytes"
                    ) from None
                if not chunk.data:  # the end
                    status = (chunk.headers or {}).get("Status")
                    if status not in (None, "204"):
                        why = (chunk.headers or {}).get("Description", "")
                        raise BusError(
                            f"snapshot of {name}: the server stopped it after {size} bytes "
                            f"({status} {why})".rstrip()
                        )
                    break
                out.write(chunk.data)
                digest.update(chunk.data)
                size += len(chunk.data)
                if chunk.reply:  # flow control: the server waits for this before more
                    await nc.publish(chunk.reply, b"")
            out.flush()
            os.fsync(out.fileno())
    except nats.errors.Error as exc:
        raise BusError(f"snapshot of {name} failed: {exc!r}") from exc
    finally:
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            await subscription.unsubscribe()
    config, state = answer.get("config"), answer.get("state")
    if not isinstance(config, dict) or not isinstance(state, dict):
        raise BusError(f"snapshot of {name}: the server's answer lacks the config and state")
    meta = {"config": config, "state": state, "info": info}
    meta_bytes = json.dumps(meta, indent=2, sort_keys=True).encode()
    meta_path = directory / f"{name}.json"
    written.append(meta_path)
    _write_atomically(meta_path, meta_bytes)
    return StreamEntry(
        name=name,
        messages=int(state.get("messages", 0)),
        bytes=int(state.get("bytes", 0)),
        first_seq=int(state.get("first_seq", 0)),
        last_seq=int(state.get("last_seq", 0)),
        snapshot_size=size,
        sha256=digest.hexdigest(),
        meta_sha256=hashlib.sha256(meta_bytes).hexdigest(),
    )


def _server_version(nc: Client) -> str:
    version = nc.connected_server_version
    try:
        return f"{version.major}.{version.minor}.{version.patch}" + (
            f"-{version.dev}" if version.dev else ""
        )
    except ValueError:
        return "unknown"


# restore


async def restore(
    nc: Client,
    prefix: str,
    directory: Path | str,
    *,
    replicas: int | None = None,
    force: bool = False,
    timeout: float = TIMEOUT,
) -> Manifest:
    """Recreate every stream of the backup in `directory` on the server `nc` is connected
    to, with the sequences, headers, KV revisions and consumers it had (and `replicas` as
    its replica count, when given).

    Nothing is created before every file matched its checksum (`BackupInvalid`) and no
    stream of the backup exists on the server (`StreamExists`; with `force` those are
    deleted first). Each restored stream must then count the messages and end at the
    sequence the manifest says (`BusError` when it does not)."""
    if replicas is not None and not 1 <= replicas <= 5:
        raise ValueError(f"--replicas {replicas}: JetStream keeps 1 to 5 replicas")
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest.prefix != prefix:
        raise BackupInvalid(
            f"{directory} is a backup of prefix {manifest.prefix!r}, not {prefix!r} "
            "(stream names carry the prefix and cannot be changed by a restore)"
        )
    metas = {entry.name: _read_meta(directory, entry) for entry in manifest.streams}
    existing = [
        entry.name
        for entry in manifest.streams
        if await _stream_info(nc, entry.name, timeout) is not None
    ]
    if existing and not force:
        raise StreamExists(existing)
    for name in existing:
        answer = await _api(nc, f"$JS.API.STREAM.DELETE.{name}", None, timeout)
        _raise_for(answer, f"deleting {name} before the restore")
    for entry in manifest.streams:
        config = dict(metas[entry.name]["config"])
        if replicas is not None:
            before = int(config.get("num_replicas") or 1)
            config["num_replicas"] = replicas
            # JetStream reserves a byte limit once per replica: the stream keeps its share
            # of the account's store (`streams.StoreLimits`) over its new replica count
            if int(config.get("max_bytes") or -1) > 0:
                share = int(config["max_bytes"]) * before
                config["max_bytes"] = streams.replica_bytes(share, replicas)
        state = await _restore_stream(
            nc, entry, config, metas[entry.name]["state"], directory, timeout
        )
        have = (int(state.get("messages", 0)), int(state.get("last_seq", 0)))
        if have != (entry.messages, entry.last_seq):
            raise BusError(
                f"restored {entry.name} holds {have[0]} messages up to sequence {have[1]}; "
                f"the backup holds {entry.messages} up to {entry.last_seq}"
            )
    return manifest


def read_manifest(directory: Path | str) -> Manifest:
    """The manifest of the backup in `directory`, once every file it names has the size
    and checksum it records; `BackupInvalid` otherwise."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BackupInvalid(f"{directory}: no such directory")
    path = directory / MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise BackupInvalid(f"{path} not found: not a backup, or one that did not finish") from None
    except OSError as exc:
        raise BackupInvalid(f"cannot read {path}: {exc}") from None
    try:
        document = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackupInvalid(f"{path} is not JSON: {exc}") from None
    if isinstance(document, dict) and document.get("format") != FORMAT:
        raise BackupInvalid(
            f"{path}: backup format {document.get('format')!r}, this gpuop reads {FORMAT}"
        )
    try:
        manifest = Manifest.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BackupInvalid(
            f"{path} is not a gpuop backup manifest: {where}: {first['msg']}"
        ) from None
    names = [entry.name for entry in manifest.streams]
    if len(set(names)) != len(names):
        raise BackupInvalid(f"{path} names a stream twice")
    for entry in manifest.streams:
        _check(directory / entry.snapshot_file, entry.snapshot_size, entry.sha256)
        _check(directory / entry.meta_file, None, entry.meta_sha256)
    return manifest


def _check(path: Path, size: int | None, sha256: str) -> None:
    try:
        have_size, have_sha = _digest(path)
    except FileNotFoundError:
        raise BackupInvalid(f"{path} is missing") from None
    except OSError as exc:
        raise BackupInvalid(f"cannot read {path}: {exc}") from None
    if size is not None and have_size != size:
        raise BackupInvalid(
            f"{path} has {have_size} bytes, the manifest says {size}: truncated or replaced"
        )
    if have_sha != sha256:
        raise BackupInvalid(f"{path}: checksum mismatch (sha256 {have_sha}, manifest {sha256})")


def _read_meta(directory: Path, entry: StreamEntry) -> dict[str, Any]:
    path = directory / entry.meta_file
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackupInvalid(f"cannot read {path}: {exc}") from None
    config = meta.get("config") if isinstance(meta, dict) else None
    state = meta.get("state") if isinstance(meta, dict) else None
    if not isinstance(config, dict) or not isinstance(state, dict):
        raise BackupInvalid(f"{path} lacks the stream's config and state")
    if config.get("name") != entry.name:
        raise BackupInvalid(f"{path} holds the config of {config.get('name')!r}, not {entry.name}")
    return {"config": config, "state": state}


async def _restore_stream(
    nc: Client,
    entry: StreamEntry,
    config: dict[str, Any],
    state: dict[str, Any],
    directory: Path,
    timeout: float,
) -> dict[str, Any]:
    """Send one snapshot; the restored stream's state."""
    answer = await _api(
        nc, f"$JS.API.STREAM.RESTORE.{entry.name}", {"config": config, "state": state}, timeout
    )
    _raise_for(answer, f"restore of {entry.name}")
    deliver = answer.get("deliver_subject")
    if not isinstance(deliver, str) or not deliver:
        raise BusError(f"restore of {entry.name}: the server named no subject to send to")
    chunk_size = max(1024, min(RESTORE_CHUNK, int(nc.max_payload) - 1024))
    try:
        for chunk in _chunks(directory / entry.snapshot_file, chunk_size):
            reply = await _deliver(nc, deliver, chunk, timeout)
            if reply.data:  # an error, as JSON or as the server's -ERR text
                raise BusError(f"restore of {entry.name} refused: {_describe(reply.data)}")
        final = await nc.request(deliver, b"", timeout=max(timeout, FINISH_TIMEOUT))
    except (TimeoutError, nats.errors.TimeoutError):
        raise BusError(f"restore of {entry.name}: the server did not answer in time") from None
    except nats.errors.Error as exc:
        raise BusError(f"restore of {entry.name} failed: {exc!r}") from exc
    result = _parse(final.data, f"restore of {entry.name}")
    _raise_for(result, f"restore of {entry.name}")
    restored = result.get("state")
    if not isinstance(restored, dict):
        raise BusError(f"restore of {entry.name}: the server's last answer has no state")
    return restored


async def _deliver(nc: Client, subject: str, chunk: bytes, timeout: float) -> Any:
    """`chunk` sent to a restore's deliver subject, again while it has no responders yet."""
    waited = 0.0
    while True:
        try:
            return await nc.request(subject, chunk, timeout=timeout)
        except nats.errors.NoRespondersError:
            if waited >= DELIVER_INTEREST_SECONDS:
                raise
        await asyncio.sleep(0.1)
        waited += 0.1


# the JetStream API


async def _api(nc: Client, subject: str, body: Any, timeout: float) -> dict[str, Any]:
    payload = b"" if body is None else json.dumps(body).encode()
    try:
        message = await nc.request(subject, payload, timeout=timeout)
    except nats.errors.NoRespondersError:
        raise BusError(f"{subject}: no responder; is JetStream enabled?") from None
    except (TimeoutError, nats.errors.TimeoutError):
        raise BusError(
            f"{subject}: no answer within {timeout:g} s (may this user use the JetStream API?)"
        ) from None
    except nats.errors.Error as exc:
        raise BusError(f"{subject} failed: {exc!r}") from exc
    return _parse(message.data, subject)


async def _stream_info(nc: Client, name: str, timeout: float) -> dict[str, Any] | None:
    """The stream's info without its type, or None when it does not exist."""
    answer = await _api(nc, f"$JS.API.STREAM.INFO.{name}", None, timeout)
    error = answer.get("error")
    if isinstance(error, dict) and error.get("err_code") == STREAM_NOT_FOUND:
        return None
    _raise_for(answer, f"info of {name}")
    answer.pop("type", None)
    return answer


def _parse(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BusError(f"{what}: the server answered {_describe(data)}") from None
    if not isinstance(document, dict):
        raise BusError(f"{what}: the server answered {_describe(data)}")
    return document


def _raise_for(answer: dict[str, Any], what: str) -> None:
    error = answer.get("error")
    if error:
        detail = error.get("description", error) if isinstance(error, dict) else error
        raise BusError(f"{what} failed: {detail}")


def _describe(data: bytes) -> str:
    try:
        document = json.loads(data)
        if isinstance(document, dict) and isinstance(document.get("error"), dict):
            return str(document["error"].get("description", document["error"]))
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    return repr(data[:200].decode(errors="replace"))


# files


def _create(path: Path) -> BinaryIO:
    return path.open("xb")


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)


def _digest(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    for chunk in _chunks(path, 1024 * 1024):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _chunks(path: Path, size: int) -> Iterator[bytes]:
    with path.open("rb") as source:
        while chunk := source.read(size):
            yield chunk
