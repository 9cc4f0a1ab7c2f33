"""gpuop_sim: the simulation gpuop is tested and demonstrated on, a distribution of its own
beside the product. It depends on `gpuop`; `gpuop` never imports it and finds what it adds
through entry points (`gpuop.plugins`): the `sim:<gpus>` NVML backend, the simulated kernel
and reboot, and the `gpuop demo` and `gpuop sim` commands. The image installs only `gpuop`.

    apiserver   a Kubernetes API server written from the apiserver's semantics, served over
                HTTPS to the official client; it imports none of gpuop's Kubernetes client
                code, so it cannot share a bug with the client it tests
    cluster     the cluster around it (`SimCluster`): machines, kubelets and their gRPC side,
                the scheduler, workload controllers, generated GPU workloads, host roots
    host        the simulated kernel (`SimKernel`), its state, stand-in kmod tools, seeded
                host roots, and the plugin the driver-manager loads (`host.plugin`)
    nvml        `SimNvml`: H200s with moving metrics, XIDs, ECC, MIG, NVLink and NUMA, and
                the `sim:<gpus>` backend (`nvml.backend`)
    recordings  the recorded H200 node everything above is made from (read, never edited)
    cli         `gpuop demo` and `gpuop sim` (`apiserver`, `host`), and the demo's live view

Layers, bottom up: recordings -> host, nvml -> apiserver -> cluster -> cli.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuop_sim.apiserver.accounting import RequestKind
    from gpuop_sim.apiserver.faults import FaultPlan
    from gpuop_sim.apiserver.server import ApiServer, RequestRecord
    from gpuop_sim.apiserver.threaded import ThreadedApiServer
    from gpuop_sim.cluster.cluster import SimCluster

_EXPORTED = {
    "ApiServer": "gpuop_sim.apiserver.server",
    "FaultPlan": "gpuop_sim.apiserver.faults",
    "RequestKind": "gpuop_sim.apiserver.accounting",
    "RequestRecord": "gpuop_sim.apiserver.server",
    "SimCluster": "gpuop_sim.cluster.cluster",
    "ThreadedApiServer": "gpuop_sim.apiserver.threaded",
}
"""Imported when first asked for: a node agent that loads only the `sim:<gpus>` NVML backend
or the simulated kernel must not carry the API server and the cluster (attrs, TLS, a
twentieth of its memory)."""

__all__ = [
    "ApiServer",
    "FaultPlan",
    "RequestKind",
    "RequestRecord",
    "SimCluster",
    "ThreadedApiServer",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTED.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuop_sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
