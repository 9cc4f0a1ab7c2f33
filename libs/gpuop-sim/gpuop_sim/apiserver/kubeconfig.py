"""Kubeconfig files that point clients at the simulated API server.

The product reaches the simulated server exactly as it reaches a real cluster: through a
kubeconfig read by ``kubernetes.config.load_kube_config`` (or the ``kubernetes.aio``
equivalent). ``ApiServer.write_kubeconfig`` and ``gpuop sim apiserver`` call
:func:`write_kubeconfig`; the file holds the server URL, the bearer token and one context,
and is readable by its owner only because it carries a credential.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONTEXT = "gpuop-sim"


def kubeconfig(
    server: str, token: str, *, context: str = DEFAULT_CONTEXT, namespace: str = "default"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": {"server": server}}],
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
            kubeconfig(server, token, context=context, namespace=namespace), file, sort_keys=False
        )
    partial.replace(path)
    return path
