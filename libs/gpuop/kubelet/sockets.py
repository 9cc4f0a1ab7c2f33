"""gRPC addresses of unix sockets at any path length.

A unix socket path may hold at most 107 bytes (gRPC binds 105), and a host root in a test or
the demo can push `<host root>/var/lib/kubelet/device-plugins/nvidia-gpu.sock` past that.
`UnixTarget` then opens the socket's directory and names the socket through
`/proc/self/fd/<fd>/`, which the kernel resolves to the same file; the directory stays
open until `close()`, so a channel that reconnects later still finds it. Short paths are
used as they are.

Every gRPC server and channel on a kubelet socket (the device plugin, the simulated
kubelet, telemetry's PodResources client) gets its address here; the plugins' servers bind
through `serve`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc

from gpuop.lifecycles import Closing

MAX_SOCKET_PATH = 105
"""Bytes of a socket path gRPC binds as it is: `sun_path` holds 108 with the terminating NUL,
but gRPC's own check refuses 106 and 107 already ("Path name should not have more than 107
characters"; measured with grpcio 1.85, and seen to stop the device plugin in an end-to-end
test whose host root made the path 106 bytes long)."""


class UnixTarget(Closing):
    """The gRPC address (`unix://...`) of the socket at `path`, usable whatever its length.

    Raises `FileNotFoundError` when the path is too long and its directory is missing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        """The socket's real path."""
        self._directory: int | None = None
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            self.address = f"unix://{path}"
            """What `grpc.aio.server().add_insecure_port` and `insecure_channel` take."""
        else:
            self._directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
            self.address = f"unix:///proc/self/fd/{self._directory}/{path.name}"

    def close(self) -> None:
        """Let go of the directory (a no-op for a short path); safe to call twice."""
        if self._directory is not None:
            os.close(self._directory)
            self._directory = None


async def serve(server: grpc.aio.Server, path: Path) -> UnixTarget:
    """Start `server` on a socket at `path`, its directory made and a stale file of an
    earlier run removed; the target, to close once the server stopped."""
    target = await asyncio.to_thread(_fresh, path)
    try:
        server.add_insecure_port(target.address)
        await server.start()
    except BaseException:
        target.close()
        raise
    return target


def _fresh(path: Path) -> UnixTarget:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    return UnixTarget(path)
