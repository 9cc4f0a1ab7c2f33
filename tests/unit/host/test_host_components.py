"""The module graph: what loads before what, and which component a module belongs to."""

from __future__ import annotations

import pytest

from gpuop.host import components


def test_a_whole_component_unloads_dependents_first() -> None:
    assert components.unload_order(components.modules_of(components.GPU)) == (
        "nvidia_peermem",
        "nvidia_uvm",
        "nvidia_drm",
        "nvidia_modeset",
        "nvidia",
    )
    assert components.unload_order(components.modules_of(components.OFED)) == (
        "mlx5_ib",
        "ib_core",
        "mlx5_core",
    )


def test_load_order_puts_needs_first_and_keeps_only_the_given_modules() -> None:
    assert components.load_order(["nvidia_drm", "nvidia_uvm", "nvidia"]) == (
        "nvidia",
        "nvidia_drm",
        "nvidia_uvm",
    )
    assert components.load_order(["mlx5_ib", "ib_core", "unmanaged"]) == (
        "ib_core",
        "mlx5_ib",
        "unmanaged",
    )


def test_dependencies_dependents_and_components() -> None:
    assert components.dependencies("nvidia_drm") == ("nvidia", "nvidia_modeset")
    assert set(components.dependents("nvidia")) == {
        "nvidia_modeset",
        "nvidia_drm",
        "nvidia_uvm",
        "nvidia_peermem",
    }
    assert components.component_of("mlx5_core") == components.OFED
    assert components.component_of("ext4") is None
    with pytest.raises(KeyError):
        components.modules_of("storage")
