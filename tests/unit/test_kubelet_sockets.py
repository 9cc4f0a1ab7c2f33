"""Unix socket paths of every length bind with gRPC through `UnixTarget`, the lengths just
past what gRPC takes as it is (106 and 107 bytes) included."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import grpc
import pytest

from gpuop.kubelet.sockets import MAX_SOCKET_PATH, UnixTarget


@pytest.mark.parametrize("length", [MAX_SOCKET_PATH, MAX_SOCKET_PATH + 1, 107, 108, 140])
async def test_a_server_binds_and_a_client_connects_at_any_path_length(length: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sock-", dir="/tmp") as base:
        name = "plugin.sock"
        padding = length - len(base) - len(name) - 2  # two slashes
        directory = Path(base) / ("d" * padding)
        directory.mkdir()
        path = directory / name
        assert len(os.fsencode(path)) == length
        with UnixTarget(path) as target:
            server = grpc.aio.server()
            assert server.add_insecure_port(target.address) == 1
            await server.start()
            try:
                async with grpc.aio.insecure_channel(target.address) as channel:
                    await channel.channel_ready()
            finally:
                await server.stop(None)
