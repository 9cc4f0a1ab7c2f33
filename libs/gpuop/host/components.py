"""The driver components gpuop manages and the kernel modules each is made of, with the
dependencies between them.

The driver-manager unloads a component with `unload_order` (dependents first, since
`KernelOps.unload` removes only the module it is given) and loads it with `load_order`; the
package builder writes these dependencies into its module stand-ins, and the simulated
kernel uses them for a host root whose `sys/module/*/holders` were not recorded.

    gpu:   nvidia ← nvidia_modeset ← nvidia_drm     (nvidia_drm needs both)
           nvidia ← nvidia_uvm, nvidia_peermem
    ofed:  mlx5_core, ib_core ← mlx5_ib
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

GPU = "gpu"
"""The NVIDIA GPU kernel driver."""
OFED = "ofed"
"""The Mellanox OFED / DOCA network driver."""

MODULES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        GPU: ("nvidia", "nvidia_modeset", "nvidia_drm", "nvidia_uvm", "nvidia_peermem"),
        OFED: ("mlx5_core", "ib_core", "mlx5_ib"),
    }
)
"""Each component's modules, in an order they can be loaded in."""

DEPENDS_ON: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "nvidia": (),
        "nvidia_modeset": ("nvidia",),
        "nvidia_drm": ("nvidia", "nvidia_modeset"),
        "nvidia_uvm": ("nvidia",),
        "nvidia_peermem": ("nvidia",),
        "mlx5_core": (),
        "ib_core": (),
        "mlx5_ib": ("mlx5_core", "ib_core"),
    }
)
"""The modules each managed module needs loaded first."""


def component_of(module: str) -> str | None:
    """The component `module` belongs to; None for a module gpuop does not manage."""
    for component, modules in MODULES.items():
        if module in modules:
            return component
    return None


def modules_of(component: str) -> tuple[str, ...]:
    """The modules of `component`, in load order; `KeyError` for an unknown component."""
    return MODULES[component]


def dependencies(module: str) -> tuple[str, ...]:
    """What `module` needs loaded first; empty for an unmanaged module."""
    return DEPENDS_ON.get(module, ())


def dependents(module: str) -> tuple[str, ...]:
    """The managed modules that need `module`."""
    return tuple(other for other, needs in DEPENDS_ON.items() if module in needs)


def load_order(modules: Iterable[str]) -> tuple[str, ...]:
    """`modules` ordered so every one comes after those it depends on; otherwise the given
    order is kept. Only the given modules appear in the result."""
    wanted = list(dict.fromkeys(modules))
    ordered: list[str] = []

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in ordered:
            return
        if module in path:
            raise ValueError(f"dependency cycle: {' -> '.join((*path, module))}")
        for needed in dependencies(module):
            if needed in wanted:
                visit(needed, (*path, module))
        ordered.append(module)

    for module in wanted:
        visit(module, ())
    return tuple(ordered)


def unload_order(modules: Iterable[str]) -> tuple[str, ...]:
    """`modules` ordered so every one comes before those it depends on."""
    return tuple(reversed(load_order(modules)))
