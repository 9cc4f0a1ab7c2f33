"""gpuop.kube imports the official client without the dynamic client's validator, which
(with jsonschema and rfc3987_syntax) costs about 20 MB in every process that talks to the API
server; each case runs in a fresh interpreter, since this one already imported the client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("kubernetes_validate")  # installed in development; absent, nothing to hide

HEAVY = ("kubernetes_validate", "jsonschema", "rfc3987_syntax")


def loaded_after(code: str) -> dict[str, bool]:
    """Run `code` in a fresh interpreter; which of `HEAVY` (and the client) it loaded."""
    names = (*HEAVY, "kubernetes.aio")
    report = f"import json, sys; print(json.dumps({{m: m in sys.modules for m in {names!r}}}))"
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{report}"], capture_output=True, text=True, check=True
    )
    loaded: dict[str, bool] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_importing_the_kube_client_leaves_the_validator_and_jsonschema_out() -> None:
    loaded = loaded_after("import gpuop.kube.client")
    assert loaded == {"kubernetes.aio": True} | dict.fromkeys(HEAVY, False)


def test_the_validator_can_still_be_imported_after_the_client() -> None:
    loaded = loaded_after("import gpuop.kube.client\nimport kubernetes_validate")
    assert loaded["kubernetes_validate"] and loaded["kubernetes.aio"]


def test_a_process_that_loaded_the_validator_first_keeps_it_for_the_client() -> None:
    loaded = loaded_after("import kubernetes_validate\nimport gpuop.kube.client")
    assert loaded["kubernetes_validate"] and loaded["kubernetes.aio"]


def test_a_node_agent_reaching_only_the_kube_errors_loads_no_client() -> None:
    # the CLI imports gpuop.kube.errors in every process; node agents never talk to the API
    # server, so the guard must not import the client on their behalf
    loaded = loaded_after("import gpuop.cli.main\nimport gpuop.kube.errors")
    assert not loaded["kubernetes.aio"]
