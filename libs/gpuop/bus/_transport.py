"""nats-py without its WebSocket transport.

nats-py imports aiohttp at import time whenever it is installed, for `ws://` URLs only; gpuop
speaks plain NATS (`nats://`, `tls://`) and never uses it. In a node agent aiohttp and what it
pulls in are about 10 MB of resident memory and a tenth of a second of start-up for nothing,
so the first import of nats here is made with aiohttp hidden. A process that already imported
aiohttp (the cluster roles' Kubernetes client) keeps it, and nats with it.
"""

from __future__ import annotations

import sys


def import_nats_without_websockets() -> None:
    """Import nats-py's transports while `import aiohttp` fails, unless aiohttp is loaded."""
    if "nats.aio.transport" in sys.modules or "aiohttp" in sys.modules:
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # makes `import aiohttp` fail
    try:
        import nats.aio.transport  # noqa: F401
    finally:
        del sys.modules["aiohttp"]  # later importers (a Kubernetes client) get the real one


import_nats_without_websockets()
