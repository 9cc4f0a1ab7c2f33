"""The registry of saga kinds: `KINDS`, what the orchestrator's runtime and `gpuop replay`
iterate (neither names a kind).

A new kind is one folder under `gpuop.saga` (kind, table, phases, records, drafting, its
`folding` with its `SagaKind`), one starter in the orchestrator (what starts its sagas) and
one entry here.
"""

from __future__ import annotations

from typing import Any

from gpuop.saga.device_api import folding as device_api
from gpuop.saga.kinds import SagaKind
from gpuop.saga.mig import folding as mig
from gpuop.saga.remediation import folding as remediation
from gpuop.saga.upgrade import folding as upgrade

KINDS: tuple[SagaKind[Any], ...] = (upgrade.KIND, remediation.KIND, mig.KIND, device_api.KIND)
"""Every saga kind, in the order an event is decided for a node's sagas: the upgrade first
(a remediation folded into it reads its moves), then the remediation, then MIG, then the
device-API switch."""


def kind_named(name: str) -> SagaKind[Any]:
    """The kind called `name`; `KeyError` when none is."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise KeyError(name)
