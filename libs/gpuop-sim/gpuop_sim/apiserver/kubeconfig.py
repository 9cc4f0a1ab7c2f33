"""Kubeconfig files that point clients at the simulated API server.

The product reaches the simulated server exactly as it reaches a real cluster: through a
kubeconfig read by ``kubernetes.config.load_kube_config`` (or the ``kubernetes.aio``
equivalent), or kubectl. ``ApiServer.write_kubeconfig`` and ``gpuop sim apiserver`` call
:func:`write_kubeconfig`; the file holds the ``https`` server URL, the CA that signed the
server's certificate (``certificate-authority-data``), the bearer token and one context,
and is readable by its owner only because it carries a credential. :func:`ssl_context`
reads the CA back, for a raw HTTP client (aiohttp) of a server in another process.
"""

from __future__ import annotations

import base64
import os
import ssl
from pathlib import Path
from typing import Any

import yaml

from gpuop_sim.apiserver import certificates

DEFAULT_CONTEXT = "gpuop-sim"


def kubeconfig(
    server: str,
    token: str,
    ca_pem: bytes | None = None,
    *,
    context: str = DEFAULT_CONTEXT,
    namespace: str = "default",
) -> dict[str, Any]:
    """``ca_pem``: the CA the server's certificate is checked against; None leaves it to the
    system's CAs (a kubeconfig for a server that is not the simulated one)."""
    cluster = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode("ascii")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [
            {
                "name": context,
                "context": {"cluster": context, "user": context, "namespace": namespace},
            }
        ],
        "current-context": context,
    }


def write_kubeconfig(
    path: Path,
    server: str,
    token: str,
    ca_pem: bytes | None = None,
    *,
    context: str = DEFAULT_CONTEXT,
    namespace: str = "default",
) -> Path:
    """Write the kubeconfig atomically with mode 0600; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        yaml.safe_dump(
            kubeconfig(server, token, ca_pem, context=context, namespace=namespace),
            file,
            sort_keys=False,
        )
    partial.replace(path)
    return path


def ssl_context(path: Path) -> ssl.SSLContext:
    """A client TLS context trusting the CA of the kubeconfig's current cluster."""
    config = yaml.safe_load(path.read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == current["context"]["cluster"])
    ca_pem = base64.b64decode(cluster["cluster"]["certificate-authority-data"])
    return certificates.client_context(ca_pem)
