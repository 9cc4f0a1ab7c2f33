"""How the chart's node agents reach NVML on a node where gpuop is the only NVIDIA software:
the driver's own libnvidia-ml from the user space the driver-manager installed, mounted
read-only, found through LD_LIBRARY_PATH; and the two values a simulated node sets
(`nodeAgents.nvml`, `nodeAgents.hostRoot`), as `make cluster` and the real-node chart test
install it."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from gpuop.host import packages
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import installing
from tests.support.charts import Manifest, render, render_with

NVML_AGENTS = ("discovery", "device-plugin", "telemetry")
"""The node agents that open NVML."""


def agent(rendering_name: str | None, name: str, overrides: dict | None = None) -> Manifest:  # type: ignore[type-arg]
    rendering = render(rendering_name) if rendering_name else render_with(overrides)
    return rendering.get("DaemonSet", f"gpuop-{name}")


def env(workload: Manifest) -> dict[str, str]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def mounts(workload: Manifest) -> dict[str, tuple[str, bool]]:
    """mount path -> (host path, read-only) of each hostPath volume."""
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sources = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    return {
        m["mountPath"]: (sources[m["name"]], bool(m.get("readOnly")))
        for m in container["volumeMounts"]
        if m["name"] in sources
    }


@pytest.mark.parametrize("name", NVML_AGENTS)
def test_nvml_is_loaded_from_the_drivers_user_space_mounted_read_only(name: str) -> None:
    workload = agent("defaults", name)
    library_path = PurePosixPath(env(workload)["LD_LIBRARY_PATH"])
    found = mounts(workload)
    under = [m for m in found if library_path.is_relative_to(m)]
    assert under, f"{library_path} is under no host path mount of {name}: {sorted(found)}"
    (mount,) = under
    host, read_only = found[mount]
    assert read_only
    # the library directory on the host is the one the driver-manager switches
    relative = library_path.relative_to(mount)
    assert PurePosixPath(host) / relative == PurePosixPath(
        f"/{packages.USERSPACE}/gpu/{packages.CURRENT}/lib"
    )
    assert env(workload)["GPUOP_NVML"] == "real"
    assert "runtimeClassName" not in workload["spec"]["template"]["spec"]


def test_the_current_link_resolves_inside_the_mount(tmp_path: Path) -> None:
    """The driver-manager's `current` link is relative, so the path the agents load from
    resolves within their read-only mount of the user space, not in their own file system."""
    root = HostRoot(tmp_path)
    version = installing.userspace_dir(root, "gpu", "580.65.06")
    (version / "lib").mkdir(parents=True)
    (version / "lib" / "libnvidia-ml.so.1").write_text("library")
    installing.activate_userspace(root, "gpu", "580.65.06")
    link = installing.userspace_dir(root, "gpu") / packages.CURRENT
    assert not os.path.isabs(os.readlink(link))
    assert (link / "lib" / "libnvidia-ml.so.1").read_text() == "library"


@pytest.mark.timeout(60)  # seven renders of the whole chart: over 15 s on a loaded machine
def test_a_simulated_node_sets_the_nvml_and_the_root_of_every_host_path() -> None:
    overrides = {"nodeAgents": {"nvml": "sim:8", "hostRoot": "/srv/node/host/"}}
    for name in (*NVML_AGENTS, "driver-manager", "network-manager"):
        workload = agent(None, name, overrides)
        assert env(workload)["GPUOP_NVML"] == "sim:8"
        for host, _ in mounts(workload).values():
            assert (host + "/").startswith("/srv/node/host/"), (name, host)
            assert "//" not in host
    driver_manager = agent(None, "driver-manager", overrides)
    assert mounts(driver_manager)["/host"][0] == "/srv/node/host"
    assert mounts(agent("defaults", "driver-manager"))["/host"][0] == "/"
