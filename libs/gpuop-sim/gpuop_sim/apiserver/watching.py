"""Watch streams: newline-delimited JSON events over a chunked HTTP response.

Called by the HTTP handlers for ``GET <collection>?watch=...``. The watch registers with
the store *before* it reads the state it starts from, so no write can fall in between.
Where the stream starts follows ``resourceVersion`` and ``sendInitialEvents``: ADDED for
the current state (unset or ``0``), the changes after ``N``, or the current state closed by a
BOOKMARK annotated ``k8s.io/initial-events-end``. A version older than the retained history
gets a single in-stream ERROR event carrying a 410 ``Expired`` Status, with HTTP 200.
On a filtered watch an object that stops matching arrives as DELETED and one that starts
matching as ADDED. ``allowWatchBookmarks`` adds periodic BOOKMARK events;
``timeoutSeconds`` ends the stream cleanly, and so does the server's fault plan
(``faults.py``) when it drops watches: ``on_open`` registers each stream with it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gpuop_sim.apiserver import errors
from gpuop_sim.apiserver.listing import ListOptions
from gpuop_sim.apiserver.resources import ResourceType
from gpuop_sim.apiserver.store import Change, Store, Watcher

Obj = dict[str, Any]

INITIAL_EVENTS_END = "k8s.io/initial-events-end"

WatchOpened = Callable[[Callable[[], None]], Callable[[], None]]
"""Told of each new stream with the function that ends it cleanly; returns the function to
call once the stream is over (``FaultPlan.watch_opened``)."""


def _line(event_type: str, obj: Obj) -> bytes:
    return (json.dumps({"type": event_type, "object": obj}, separators=(",", ":")) + "\n").encode()


class WatchStream:
    """One client's watch: converts store changes into the events its filter sees."""

    def __init__(self, store: Store, resource: ResourceType, options: ListOptions) -> None:
        self.store = store
        self.resource = resource
        self.options = options

    def _present(self, obj: Obj, resource_version: int | None = None) -> Obj:
        shown = {**obj, "apiVersion": self.resource.api_version, "kind": self.resource.kind}
        if resource_version is not None:
            shown["metadata"] = {**obj["metadata"], "resourceVersion": str(resource_version)}
        return shown

    def event(self, change: Change) -> bytes | None:
        """The event this watch sees for a change, or None when it sees nothing."""
        now_matches = change.type != "DELETED" and self.options.matches(change.object)
        was_matching = change.previous is not None and self.options.matches(change.previous)
        if now_matches and was_matching:
            return _line("MODIFIED", self._present(change.object))
        if now_matches:
            return _line("ADDED", self._present(change.object))
        if was_matching and change.previous is not None:
            # Like the watch cache: the previous content, at the version of this change.
            return _line("DELETED", self._present(change.previous, change.resource_version))
        return None

    def bookmark(self, *, initial_events_end: bool = False) -> bytes:
        metadata: Obj = {"resourceVersion": str(self.store.resource_version)}
        if initial_events_end:
            metadata["annotations"] = {INITIAL_EVENTS_END: "true"}
        return _line(
            "BOOKMARK",
            {
                "kind": self.resource.kind,
                "apiVersion": self.resource.api_version,
                "metadata": metadata,
            },
        )

    def opening(self) -> list[bytes]:
        """The events that start the stream; must run right after registering the watch."""
        options = self.options
        from_now = options.resource_version in ("", "0")
        if options.send_initial_events or (options.send_initial_events is None and from_now):
            lines = [
                _line("ADDED", self._present(obj))
                for obj in self.store.view(self.resource.group_resource, options.namespace)
                if options.matches(obj)
            ]
            if options.send_initial_events:
                lines.append(self.bookmark(initial_events_end=True))
            return lines
        if from_now:
            return []
        try:
            backlog = self.store.changes_since(
                self.resource.group_resource, int(options.resource_version)
            )
        except errors.ApiError as expired:
            return [_line("ERROR", expired.status())]
        return [line for change in backlog if (line := self.event(change)) is not None]


async def serve_watch(
    request: web.Request,
    store: Store,
    resource: ResourceType,
    options: ListOptions,
    *,
    bookmark_interval: float,
    on_open: WatchOpened | None = None,
) -> web.StreamResponse:
    """Stream events until the timeout, the server's shutdown, the fault plan ending it or
    the client leaving."""
    stream = WatchStream(store, resource, options)
    watcher = store.watch(resource.group_resource)
    opened: Callable[[], None] | None = None
    try:
        if on_open is not None:
            opened = on_open(lambda: watcher.queue.put_nowait(None))
        opening = stream.opening()
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            await _stream(response, stream, watcher, opening, options, bookmark_interval)
            await response.write_eof()
        except ConnectionResetError:
            # The client went away mid-write, or as the stream ended; nobody is left to
            # answer.
            pass
        return response
    finally:
        store.stop_watching(watcher)
        if opened is not None:
            opened()


async def _stream(
    response: web.StreamResponse,
    stream: WatchStream,
    watcher: Watcher,
    opening: list[bytes],
    options: ListOptions,
    bookmark_interval: float,
) -> None:
    for line in opening:
        await response.write(line)
    if opening and opening[-1].startswith(b'{"type":"ERROR"'):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.timeout_seconds if options.timeout_seconds else None
    next_bookmark = loop.time() + bookmark_interval if options.allow_bookmarks else None
    while True:
        if deadline is not None and loop.time() >= deadline:
            return
        if not watcher.queue.empty():
            change = watcher.queue.get_nowait()
        else:
            wakeups = [moment for moment in (deadline, next_bookmark) if moment is not None]
            wait = max(min(wakeups) - loop.time(), 0.0) if wakeups else None
            try:
                change = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                # A BOOKMARK says every change up to the store's version was sent: only
                # with none left in the queue (a timeout can race a change put meanwhile).
                due = next_bookmark is not None and loop.time() >= next_bookmark
                if due and watcher.queue.empty():
                    await response.write(stream.bookmark())
                    next_bookmark = loop.time() + bookmark_interval
                continue
        if change is None:
            return
        event = stream.event(change)
        if event is not None:
            await response.write(event)
