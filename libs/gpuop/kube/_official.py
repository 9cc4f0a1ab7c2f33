"""The official Kubernetes client without its dynamic client's schema validation.

`import kubernetes.aio` runs the package `kubernetes` first, which imports its dynamic client,
which imports `kubernetes_validate` whenever it is installed (and through it jsonschema, whose
format checkers import `rfc3987_syntax`, a grammar built at import). gpuop never uses the
dynamic client; where these packages are installed (the development environment: the
product's image has none of them) they are about 20 MB of resident memory and over a second
of start-up CPU on a loaded machine in every process that talks to the API server, each
orchestrator replica included, so the benchmarks would measure them against upstream. The
first import of the client here is made with `kubernetes_validate` hidden; the dynamic client
then validates nothing, as where the package is absent. A process that already imported the
client or the validator keeps them.
"""

from __future__ import annotations

import sys


def import_client_without_validation() -> None:
    """Import the official client while `import kubernetes_validate` fails, unless either
    is already loaded."""
    if "kubernetes" in sys.modules or "kubernetes_validate" in sys.modules:
        return
    sys.modules["kubernetes_validate"] = None  # type: ignore[assignment]  # makes it fail
    try:
        import kubernetes.aio  # noqa: F401
    finally:
        del sys.modules["kubernetes_validate"]  # later importers get the real one


import_client_without_validation()
