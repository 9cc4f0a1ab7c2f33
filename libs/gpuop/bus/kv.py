"""KV buckets on JetStream: revisions, create-if-absent and compare-and-set.

Every write that depends on what was read passes the revision it read; a stale revision
raises `RevisionConflict`, and the caller re-reads and decides again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    DeliverPolicy,
    DiscardPolicy,
    Placement,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue as RawKeyValue

from gpuop.bus import streams, watching
from gpuop.bus.errors import (
    PLACEMENT_ERROR,
    BucketMissing,
    BusError,
    KeyExists,
    PlacementPending,
    PublishTimeout,
    RevisionConflict,
)
from gpuop.bus.protocol import KvEntry

log = logging.getLogger(__name__)

RECONCILE_TIMEOUT = 2.0
"""Seconds to wait for a bucket's update at start (an unauthorised one gets no answer)."""
HISTORY = 16
"""Revisions kept per key: enough to audit a saga's last steps."""
KEYS_CONSUMER_TTL = 2.0
"""Seconds the server keeps a key listing's consumer after the listing ends."""
KEYS_WAIT = 10.0
"""Seconds a key listing waits for the server's next entry before it fails."""
WATCH_CONSUMER_TTL = 300.0
"""Seconds the server keeps a watch's consumer once its watcher is gone (nats-py's)."""

_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
_DELETED = ("DEL", "PURGE")


def check_key(key: str) -> str:
    """Keys are subject tokens: letters, digits and `-/_=.`, no leading or trailing dot."""
    if not _KEY.match(key) or key.startswith(".") or key.endswith(".") or ".." in key:
        raise ValueError(f"invalid KV key {key!r}")
    return key


async def open_bucket(
    js: JetStreamContext,
    name: str,
    *,
    new_inbox: Callable[[], str],
    replicas: int = 1,
    placement: Placement | None = None,
    share: int | None = None,
    direct: bool = True,
    max_value_size: int | None = None,
) -> NatsKeyValue:
    """Open bucket `name`, creating it with file storage and `replicas` when it does not
    exist, holding at most `share` bytes of the store over all its replicas (None: no
    limit; a full bucket refuses new writes, as every KV bucket). An existing bucket with
    fewer replicas is reported and scaled up to `replicas` (never down: a service started
    with a lower count must not shed copies of the sagas), one with another byte limit is
    given `share`, one that allows roll-ups has them turned off; one on memory storage, or
    keeping less history, stops the start with the reason. With `direct`, keys are read by
    direct gets, which a permission can limit to one key (a replica may answer one write
    behind: the sagas, which the orchestrator reads to write back with compare-and-set, keep
    reading from the stream's leader). With `max_value_size` the bucket refuses a larger
    message (`streams.VALUE_BYTES`), and an existing bucket gets that bound. Watches and
    key listings are delivered to inboxes from `new_inbox` (the connection's)."""
    try:
        raw = await js.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        max_bytes = streams.replica_bytes(share, replicas) if share is not None else -1
        try:
            stream = _bucket_stream(name, replicas, placement, max_bytes, direct)
            stream.max_msg_size = -1 if max_value_size is None else max_value_size
            await js.add_stream(stream)
            raw = await js.key_value(name)
        except nats.js.errors.APIError as exc:
            if exc.err_code == PLACEMENT_ERROR:
                raise PlacementPending(f"cannot place bucket {name} yet: {exc}") from exc
            raise BucketMissing(f"cannot create bucket {name}: {exc}") from exc
    else:
        if await _reconcile(js, name, replicas, share, direct, max_value_size):
            raw = await js.key_value(name)  # it reads by direct get now
    return NatsKeyValue(name, raw, js, new_inbox)


def _bucket_stream(
    name: str, replicas: int, placement: Placement | None, max_bytes: int, direct: bool
) -> StreamConfig:
    """The stream of a bucket, as JetStream's KV layout defines it (ADR-8: one subject per
    key under `$KV.<bucket>.`, deletes denied, new writes refused when full), but without
    roll-ups: a `Nats-Rollup: all` header on a write of any key empties the whole stream, so
    with them whoever may write one key (a node agent its own) could delete every other
    key; gpuop never purges a key. Made here rather than by nats-py's `create_key_value`,
    which turns roll-ups on and leaves a placement out."""
    return StreamConfig(
        name=f"KV_{name}",
        subjects=[f"$KV.{name}.>"],
        storage=StorageType.FILE,
        num_replicas=replicas,
        placement=placement,
        max_msgs_per_subject=HISTORY,
        max_bytes=max_bytes,
        max_msgs=-1,
        max_consumers=-1,
        allow_rollup_hdrs=False,
        deny_delete=True,
        discard=DiscardPolicy.NEW,
        duplicate_window=120.0,
        # key-scoped reads (`$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`): the only
        # form a node agent's permissions can limit to its own key (gpuop.bus.grants)
        allow_direct=direct,
    )


async def _reconcile(
    js: JetStreamContext,
    name: str,
    replicas: int,
    share: int | None,
    direct: bool,
    max_value_size: int | None = None,
) -> bool:
    """Report and correct what differs (replicas, byte limit, value size, direct gets,
    roll-ups, age and discard); whether direct gets were turned on."""
    stream = f"KV_{name}"
    try:
        config = (await js.stream_info(stream)).config
    except nats.js.errors.APIError as exc:
        raise BucketMissing(f"cannot read bucket {name}: {exc}") from exc
    if config.storage != StorageType.FILE or (config.max_msgs_per_subject or 0) < HISTORY:
        raise BusError(
            f"bucket {name} exists with storage {config.storage} and history "
            f"{config.max_msgs_per_subject} (gpuop wants file, {HISTORY}): copy it out and "
            "delete it, or fix the bucket"
        )
    have = config.num_replicas or 1
    if have > replicas:
        log.warning(
            "bucket %s keeps its %d replicas (this service asks for %d: check --nats-replicas)",
            name,
            have,
            replicas,
        )
    elif have < replicas:
        log.warning(
            "bucket %s exists with %d replicas (gpuop wants %d); scaling it", name, have, replicas
        )
        config.num_replicas = replicas
    wanted = direct
    direct = bool(config.allow_direct) or not wanted
    if not direct:
        log.warning(
            "bucket %s has no direct gets (made before gpuop asked for them): reading a key "
            "then needs STREAM.MSG.GET on the whole bucket, which per-node users do not have; "
            "turning them on",
            name,
        )
        config.allow_direct = True
    rollups = bool(config.allow_rollup_hdrs)
    if rollups:
        log.warning(
            "bucket %s allows roll-ups (made by nats-py's KV, or before gpuop turned them off): "
            "a write of any key with Nats-Rollup: all empties it, so whoever may write one key "
            "could delete every other; turning them off",
            name,
        )
        config.allow_rollup_hdrs = False
    # a bucket someone made first with an age or the old-first discard would drop keys
    # (sagas, claims) silently: gpuop's keep every key until it is written again or deleted
    kept = not config.max_age and config.discard == DiscardPolicy.NEW
    if not kept:
        log.warning(
            "bucket %s drops keys (max_age %s, discard %s; gpuop wants 0, new); updating it",
            name,
            config.max_age,
            config.discard,
        )
        config.max_age = 0
        config.discard = DiscardPolicy.NEW
    sized = max_value_size is None or config.max_msg_size == max_value_size
    if not sized:
        log.warning(
            "bucket %s takes messages of up to %s bytes (gpuop wants %d); updating it",
            name,
            config.max_msg_size,
            max_value_size,
        )
        config.max_msg_size = max_value_size
    # the byte limit follows the replicas the bucket ends with (reserved once per replica)
    limit = streams.replica_bytes(share, config.num_replicas or 1) if share is not None else None
    if limit is not None and (config.max_bytes or -1) != limit:
        log.warning(
            "bucket %s holds up to %s bytes (gpuop wants %d); updating it",
            name,
            config.max_bytes,
            limit,
        )
        config.max_bytes = limit
    elif have >= replicas and direct and not rollups and sized and kept:
        return False
    try:
        async with asyncio.timeout(RECONCILE_TIMEOUT):
            await js.update_stream(config)
        return not direct
    except (TimeoutError, nats.errors.Error) as exc:
        # gpuop's users may not change a bucket's stream: an administrator does
        log.warning(
            "bucket %s not updated (%r): update it as an administrator "
            "(nats stream edit KV_%s --replicas %d --max-bytes %d --max-msg-size %d "
            "--max-age 0 --discard new --allow-direct --no-allow-rollup)",
            name,
            exc,
            name,
            config.num_replicas or 1,
            config.max_bytes or -1,
            config.max_msg_size or -1,
        )
        return False


class NatsKeyValue:
    """One bucket; raw nats errors are translated at this boundary."""

    def __init__(
        self, name: str, raw: RawKeyValue, js: JetStreamContext, new_inbox: Callable[[], str]
    ) -> None:
        self._name = name
        self._raw = raw
        self._js = js
        self._new_inbox = new_inbox

    @property
    def bucket(self) -> str:
        return self._name

    async def get(self, key: str) -> KvEntry | None:
        try:
            entry = await self._raw.get(check_key(key))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except nats.errors.Error as exc:
            raise _bus_error("get", key, exc) from exc
        return KvEntry(key, entry.value or b"", entry.revision or 0)

    async def put(self, key: str, value: bytes) -> int:
        try:
            return await self._raw.put(check_key(key), value)
        except nats.errors.Error as exc:
            raise _bus_error("put", key, exc) from exc

    async def create(self, key: str, value: bytes) -> int:
        try:
            return await self._raw.create(check_key(key), value)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KeyExists(key) from None
        except nats.errors.Error as exc:
            raise _bus_error("create", key, exc) from exc

    async def update(self, key: str, value: bytes, revision: int) -> int:
        if revision <= 0:
            raise ValueError("update needs the revision that was read; use create for new keys")
        try:
            return await self._raw.update(check_key(key), value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise RevisionConflict(key, revision, f"key {key!r}: {exc.description}") from None
        except nats.errors.Error as exc:
            raise _bus_error("update", key, exc) from exc

    async def delete(self, key: str, revision: int | None = None) -> None:
        try:
            await self._raw.delete(check_key(key), last=revision)
        except nats.js.errors.APIError as exc:
            if exc.err_code in (10071, 10164):
                raise RevisionConflict(key, revision) from None
            raise _bus_error("delete", key, exc) from exc
        except nats.errors.Error as exc:
            raise _bus_error("delete", key, exc) from exc

    async def keys(self) -> list[str]:
        # Listed with a short-lived consumer of our own, not nats.py's `keys()`: that one
        # leaves its consumer on the server for five minutes (a caller that lists often, the
        # orchestrator on every reconcile, would reach the stream's consumer limit), and it
        # decides the listing is over when the server reports nothing pending before its
        # callback has counted a delivery, which on a busy machine ends it before the first
        # entry: an empty listing of a bucket with keys. Here the end is the entry the server
        # sends with nothing pending after it, and an empty stream is asked for up front.
        stream, prefix = f"KV_{self._name}", f"$KV.{self._name}."
        found: set[str] = set()  # a key written while the listing runs comes twice
        try:
            if not (await self._js.stream_info(stream)).state.messages:
                return []
            listing, _ = await watching.named_ordered(
                self._js,
                f"{prefix}>",
                stream=stream,
                deliver=self._new_inbox(),
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                headers_only=True,
                inactive_threshold=KEYS_CONSUMER_TTL,
            )
            try:
                while True:
                    message = await listing.next_msg(timeout=KEYS_WAIT)
                    key = message.subject[len(prefix) :]
                    if (message.headers or {}).get("KV-Operation") in _DELETED:
                        found.discard(key)
                    else:
                        found.add(key)
                    if message.metadata.num_pending == 0:
                        break
            finally:
                with contextlib.suppress(TimeoutError, nats.errors.Error):
                    await listing.unsubscribe()
        except (nats.errors.Error, TimeoutError) as exc:
            raise _bus_error("keys", "*", exc) from exc
        return sorted(found)

    async def watch(self, pattern: str = ">") -> AsyncIterator[KvEntry | None]:
        # Not nats-py's `KeyValue.watch`, whose consumer's filter no permission can bind
        # (`watching`). As there: the latest entry of every matching key, then None once
        # caught up, then every change as it comes.
        stream, prefix = f"KV_{self._name}", f"$KV.{self._name}."
        entries: asyncio.Queue[KvEntry | None] = asyncio.Queue()
        caught_up = False

        async def delivered(message: Msg) -> None:
            nonlocal caught_up
            metadata = message.metadata
            headers = message.headers or {}
            deleted = (
                headers.get("KV-Operation") in _DELETED
                # nats-server 2.11's markers for keys removed by age or purge
                or headers.get("Nats-Marker-Reason") in ("MaxAge", "Purge", "Remove")
            )
            key = message.subject[len(prefix) :]
            entries.put_nowait(KvEntry(key, message.data or b"", metadata.sequence.stream, deleted))
            if metadata.num_pending == 0 and not caught_up:
                caught_up = True
                entries.put_nowait(None)

        try:
            watcher, created = await watching.named_ordered(
                self._js,
                prefix + pattern,
                stream=stream,
                deliver=self._new_inbox(),
                cb=delivered,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                inactive_threshold=WATCH_CONSUMER_TTL,
            )
        except (nats.errors.Error, TimeoutError) as exc:
            raise _bus_error("watch", pattern, exc) from exc
        # Nothing to catch up on only if the consumer had nothing to send when it was made
        # (its creation's answer, taken before any delivery; a later look at its info would
        # need a grant that shows every watch's filter, `watching`)
        if created.num_pending == 0 and not caught_up:
            caught_up = True
            entries.put_nowait(None)
        try:
            while True:
                yield await entries.get()
        finally:
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                await watcher.unsubscribe()


def _bus_error(op: str, key: str, exc: BaseException) -> BusError:
    if isinstance(exc, nats.errors.TimeoutError | TimeoutError):
        return PublishTimeout(f"kv {op} {key!r} timed out")
    if isinstance(
        exc, nats.js.errors.NoStreamResponseError | nats.js.errors.ServiceUnavailableError
    ):
        # a cluster between two leaders of the bucket's stream, or a server cut off from the
        # others (JetStream temporarily unavailable): try again in a moment
        return PublishTimeout(f"kv {op} {key!r}: no leader answered ({exc!r})")
    return BusError(f"kv {op} {key!r} failed: {exc}")
