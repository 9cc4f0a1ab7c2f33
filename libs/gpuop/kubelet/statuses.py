"""Ending an RPC with a gRPC status, for every servicer on a kubelet socket (the device
plugin's DevicePlugin, the simulated kubelet's Registration and PodResources).

`abort` says to the type checker what grpc's `ServicerContext.abort()` does at run time:
it never returns, so code after it needs no dummy value.
"""

from __future__ import annotations

from typing import NoReturn

import grpc


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the RPC with `code`; the caller's error carries `details`."""
    await context.abort(code, details)
    raise AssertionError("grpc.aio.ServicerContext.abort() returned")
