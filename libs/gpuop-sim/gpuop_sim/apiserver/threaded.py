"""The simulated API server on its own event loop in a background thread.

Synchronous clients (the official ``kubernetes`` client, kubectl-style scripts) block the
thread they run on, so they cannot share an event loop with the server. ``ThreadedApiServer``
runs an :class:`~gpuop_sim.apiserver.server.ApiServer` in a daemon thread; its test hooks are
marshalled onto the server's loop, because the store is only ever touched from there.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from gpuop_sim.apiserver.server import ApiServer

Obj = dict[str, Any]
T = TypeVar("T")


class ThreadedApiServer:
    """``with ThreadedApiServer(**options) as server:`` — options as for ApiServer."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._server: ApiServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpuop-sim-apiserver", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            async with ApiServer(**self._options) as server:
                self._server = server
                self._ready.set()
                await self._stopping.wait()
        except BaseException as failure:
            self._failure = failure
            self._ready.set()

    def __enter__(self) -> ThreadedApiServer:
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise RuntimeError("the simulated API server failed to start") from self._failure
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()

    @property
    def server(self) -> ApiServer:
        if self._server is None:
            raise RuntimeError("the simulated API server is not running")
        return self._server

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.token

    @property
    def ca_pem(self) -> bytes:
        return self.server.ca_pem

    def ssl_context(self) -> ssl.SSLContext:
        return self.server.ssl_context()

    def write_kubeconfig(self, path: Path) -> Path:
        return self.server.write_kubeconfig(path)

    def call(self, function: Callable[[ApiServer], T]) -> T:
        """Run ``function(server)`` on the server's loop and return its result."""
        if self._loop is None:
            raise RuntimeError("the simulated API server is not running")

        async def invoke() -> T:
            return function(self.server)

        return asyncio.run_coroutine_threadsafe(invoke(), self._loop).result()

    def seed(self, obj: Obj) -> Obj:
        return self.call(lambda server: server.seed(obj))

    def compact(self) -> None:
        self.call(lambda server: server.compact())

    def pause_pdb_controller(self) -> None:
        self.call(lambda server: server.pause_pdb_controller())

    def resume_pdb_controller(self) -> None:
        self.call(lambda server: server.resume_pdb_controller())
