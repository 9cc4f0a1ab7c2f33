"""A TCP relay in threads: connections to one address carried, byte for byte, to another.

The real node's pods reach the apiserver through the `kubernetes` Service: kube-proxy sends
them to the address the apiserver advertises (the node's, `ControlPlane.advertise`), while
the apiserver listens on loopback only; the node relays that address to it
(`tests.support.real_node`). TLS passes through untouched: the pods verify the apiserver's
own certificate (it names 10.96.0.1).
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress
from dataclasses import dataclass, field


@dataclass
class Relay:
    """Accepts on `listen` (host, port) and carries each connection to `target`."""

    listen: tuple[str, int]
    target: tuple[str, int]
    _server: socket.socket | None = None
    _open: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(self.listen)
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def stop(self) -> None:
        """No new connection; every open one closed."""
        if self._server is not None:
            with suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        with self._lock:
            for connection in self._open:
                with suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._open.clear()

    def _accept(self) -> None:
        server = self._server
        while server is not None:
            try:
                client, _ = server.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(
                target=self._carry, args=(client, upstream), name="relay", daemon=True
            ).start()

    def _carry(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both directions until both ends are done; then both sockets closed."""
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        with self._lock:
            self._open.difference_update((client, upstream))
        client.close()
        upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
