"""Whether containers on a node can be given its GPUs: the container runtime and CDI part
of the inventory, and the two readiness facts the node labels state.

`scanning.scan` calls `container_runtimes` and `cdi_specs` on every scan (host root only,
so also while NVML is off limits); `labeling.labels_for` calls `ready`. The node is ready
when both hold:

- a valid CDI spec of kind `nvidia.com/gpu` defines at least one device (`cdi_ready`), so a
  runtime can resolve `nvidia.com/gpu=<name>`;
- every container runtime on the node has the `nvidia` handler in its configuration and
  does not refuse CDI (`runtimes_ready`): the kubelet talks to one of them and the inventory
  does not know which, so a node with a second, unconfigured runtime is not called ready
  rather than labelled wrongly half the time. A runtime whose configuration does not parse
  has no handler. CDI off (containerd 1.6, which has none; 1.7 without `enable_cdi`) means
  a container asking for `nvidia.com/gpu=0` starts without the GPU, so the node is not ready
  even with the handler; CDI unknown (a containerd of unknown release whose configuration
  does not say) does not hold the labels back.

Then the labels `nvidia.com/cdi.ready=true` and `gpuop.io/runtime.nvidia=true` go on, and
both come off as soon as either stops holding.
"""

from __future__ import annotations

import re

from gpuop.events.hardware import CdiSpec, ContainerRuntime, ContainerRuntimeName
from gpuop.events.hardware import HardwareDiscovered as Inventory
from gpuop.host import cdi_specs as specs
from gpuop.host import runtime_handlers
from gpuop.host.roots import HostRoot

MAX_SPECS = 64
"""Spec files an inventory lists (the event's bound); more are left out of it."""
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_~-]{0,63}$")
_MESSAGE_CHARS = 2048


def container_runtimes(root: HostRoot) -> tuple[ContainerRuntime, ...]:
    """The inventory records of every container runtime installed on the host."""
    return tuple(
        ContainerRuntime(
            name=ContainerRuntimeName(state.runtime.value),
            version=state.version if state.version and _VERSION.match(state.version) else None,
            nvidia_handler=state.nvidia_handler,
            config_error=_message(state.error),
            cdi_enabled=state.cdi_enabled,
        )
        for state in runtime_handlers.runtimes(root)
    )


def cdi_specs(root: HostRoot) -> tuple[CdiSpec, ...]:
    """The inventory records of the host's `nvidia.com/gpu` spec files and malformed ones."""
    return tuple(
        CdiSpec(
            path=spec.path,
            cdi_version=spec.cdi_version,
            device_count=len(spec.device_names),
            error=_message(spec.error),
        )
        for spec in specs.read_specs(root)[:MAX_SPECS]
    )


def cdi_ready(inventory: Inventory) -> bool:
    """A valid `nvidia.com/gpu` spec defines at least one device."""
    return any(spec.error is None and spec.device_count > 0 for spec in inventory.cdi_specs)


def runtimes_ready(inventory: Inventory) -> bool:
    """The node has a container runtime, and every one it has defines the `nvidia` handler
    and does not refuse CDI."""
    runtimes = inventory.container_runtimes
    return bool(runtimes) and all(
        runtime.nvidia_handler and runtime.cdi_enabled is not False for runtime in runtimes
    )


def ready(inventory: Inventory) -> bool:
    """Both hold: the node's labels say it can run GPU containers through CDI."""
    return cdi_ready(inventory) and runtimes_ready(inventory)


def _message(text: str | None) -> str | None:
    return text[:_MESSAGE_CHARS] if text is not None else None
