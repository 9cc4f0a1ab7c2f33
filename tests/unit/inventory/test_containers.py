"""The container runtime and CDI part of a node's inventory: what a scan reports, when the
labels `nvidia.com/cdi.ready` and `gpuop.io/runtime.nvidia` go on and come off, and that an
inventory without any of it hashes and parses as it did before the fields existed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gpuop.events.hardware import CdiSpec, ContainerRuntime, ContainerRuntimeName
from gpuop.events.hardware import HardwareDiscovered as Inventory
from gpuop.host import cdi, runtimes, system
from gpuop.host.roots import HostRoot
from gpuop.inventory import cdi_devices, containers, labeling, scanning
from gpuop.nvml import open_backend
from gpuop.services.discovery import labeler
from gpuop_sim.cluster import hosts
from tests.support import cdi as cdi_support
from tests.support import container_runtimes as files
from tests.support.discovered import inventory, node_object
from tests.support.driver_manager import seed

BOOT_ID = "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
_DEBIAN_MAIN = files.CONTAINERD_MAIN_V2.replace('imports = ["/etc/containerd/conf.d/*.toml"]\n', "")
READY = {labeling.CDI_READY: "true", labeling.RUNTIME_NVIDIA: "true"}
CONTAINERD = ContainerRuntime(
    name=ContainerRuntimeName.CONTAINERD, nvidia_handler=True, cdi_enabled=True
)
CRIO = ContainerRuntime(name=ContainerRuntimeName.CRIO, nvidia_handler=True, cdi_enabled=True)
SPEC = CdiSpec(path="/var/run/cdi/nvidia.com-gpu.json", cdi_version="0.5.0", device_count=3)


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return hosts.build_host_root(tmp_path / "host", "gpu-1", 2, boot_id=BOOT_ID)


def test_a_scan_of_a_configured_node_reports_runtime_and_spec(host: HostRoot) -> None:
    files.write(host, "var/lib/dpkg/status", files.DPKG_CONTAINERD.replace("1.6.20", "1.7.22"))
    files.containerd_with_handler(host, version=2)
    files.write_spec(host, gpus=2)
    files.write(host, "etc/cdi/broken.json", "{")

    scanned = scanning.scan(host, None)

    assert scanned.container_runtimes == (
        ContainerRuntime(
            name=ContainerRuntimeName.CONTAINERD,
            version="1.7.22~ds1-1+deb12u3",
            nvidia_handler=True,
            cdi_enabled=True,
        ),
    )
    [broken, spec] = scanned.cdi_specs
    assert spec == SPEC
    assert broken.path == "/etc/cdi/broken.json"
    assert broken.device_count == 0 and "not JSON" in (broken.error or "")
    assert containers.ready(scanned)
    assert scanned.inventory_hash == scanned.content_hash()


def test_debian_12_containerd_has_no_cdi_and_the_node_is_not_ready(host: HostRoot) -> None:
    files.write(host, "var/lib/dpkg/status", files.DPKG_CONTAINERD)
    files.containerd_with_handler(host, version=2)
    files.write_spec(host, gpus=2)

    scanned = scanning.scan(host, None)

    [containerd] = scanned.container_runtimes
    assert (containerd.nvidia_handler, containerd.cdi_enabled) == (True, False)
    assert containers.cdi_ready(scanned)
    assert not containers.ready(scanned)


def test_the_driver_managers_own_spec_is_read_as_valid(tmp_path: Path) -> None:
    root = seed(tmp_path / "host")
    release = system.kernel_release(root)
    assert release is not None
    cdi_support.install_userspace(root, cdi_support.manifest("580.159.04", release))
    spec = cdi_devices.generate(root, open_backend("sim:2", host_root=root.path, node="n1"))
    cdi.write(cdi.spec_path(root), spec)

    [found] = scanning.scan(root, None).cdi_specs

    assert found.error is None
    assert found.path == "/" + f"{cdi.SPEC_DIR}/{cdi.SPEC_FILE}"
    assert found.device_count == len(json.loads(spec)["devices"]) == 5  # 0, 1, 2 UUIDs, all


@pytest.mark.parametrize(
    ("runtime", "release", "main_path", "main"),
    [
        (runtimes.Runtime.CONTAINERD, "1.7.22", files.CONTAINERD_MAIN, _DEBIAN_MAIN),
        (runtimes.Runtime.CONTAINERD, "2.1.4", files.CONTAINERD_MAIN, "version = 3\n"),
        (runtimes.Runtime.CRIO, "1.31.0", files.CRIO_MAIN_PATH, files.CRIO_MAIN),
    ],
)
def test_the_driver_managers_own_drop_in_gives_the_handler_and_cdi(
    host: HostRoot, runtime: runtimes.Runtime, release: str, main_path: str, main: str
) -> None:
    files.write(host, main_path, main)
    binary = "usr/bin/containerd" if runtime is runtimes.Runtime.CONTAINERD else "usr/bin/crio"
    files.write(host, binary, f"#!/bin/sh\necho {runtime} github.com/x v{release} abc\n")
    host.join(binary).chmod(0o755)
    runtimes.apply(host, runtimes.plan(host, runtime))

    [state] = scanning.scan(host, None).container_runtimes

    assert (state.nvidia_handler, state.config_error) == (True, None)
    assert state.cdi_enabled is not False


def test_a_broken_runtime_config_is_in_the_inventory_and_the_scan_goes_on(
    host: HostRoot,
) -> None:
    files.write(host, files.CRIO_MAIN_PATH, "[crio.runtime\n")

    scanned = scanning.scan(host, None)

    [crio] = scanned.container_runtimes
    assert crio.name is ContainerRuntimeName.CRIO and not crio.nvidia_handler
    assert crio.config_error is not None and crio.config_error.startswith("/etc/crio/crio.conf: ")


def test_a_version_the_event_cannot_carry_is_left_out(host: HostRoot) -> None:
    status = files.DPKG_CONTAINERD.replace("1.6.20~ds1-1+deb12u3", "1.6 (patched)")
    files.write(host, "var/lib/dpkg/status", status)

    [runtime] = scanning.scan(host, None).container_runtimes

    assert runtime.version is None


@pytest.mark.parametrize(
    ("runtimes", "specs", "ready"),
    [
        ((CONTAINERD,), (SPEC,), True),
        ((CRIO,), (SPEC,), True),
        ((CONTAINERD, CRIO), (SPEC,), True),
        ((), (SPEC,), False),
        ((CONTAINERD,), (), False),
        ((CONTAINERD.model_copy(update={"nvidia_handler": False}),), (SPEC,), False),
        ((CONTAINERD, CRIO.model_copy(update={"nvidia_handler": False})), (SPEC,), False),
        ((CONTAINERD.model_copy(update={"cdi_enabled": False}),), (SPEC,), False),
        ((CONTAINERD.model_copy(update={"cdi_enabled": None}),), (SPEC,), True),
        ((CONTAINERD,), (SPEC.model_copy(update={"device_count": 0}),), False),
        ((CONTAINERD,), (SPEC.model_copy(update={"error": "the spec defines no devices"}),), False),
        (
            (CONTAINERD,),
            (CdiSpec(path="/etc/cdi/broken.json", error="not JSON"), SPEC),
            True,
        ),
    ],
)
def test_labels_only_when_a_valid_spec_and_every_runtime_with_handler_and_cdi_hold(
    runtimes: tuple[ContainerRuntime, ...], specs: tuple[CdiSpec, ...], ready: bool
) -> None:
    labels = labeling.labels_for(inventory(container_runtimes=runtimes, cdi_specs=specs))

    assert {key: labels[key] for key in READY if key in labels} == (READY if ready else {})


def test_the_labels_go_on_and_come_off_with_either_condition() -> None:
    node = node_object({"team": "ml"})
    states = [
        inventory(),
        inventory(container_runtimes=(CONTAINERD,)),
        inventory(container_runtimes=(CONTAINERD,), cdi_specs=(SPEC,)),
        inventory(container_runtimes=(CONTAINERD.model_copy(update={"nvidia_handler": False}),)),
        inventory(container_runtimes=(CONTAINERD,), cdi_specs=(SPEC,)),
        inventory(container_runtimes=(CONTAINERD,)),
    ]
    seen = []
    for state in states:
        patch, _ = labeler.plan(node, state, labeling.LabelSettings())
        if patch is not None:
            _apply(node, patch)
        seen.append({key: node["metadata"]["labels"].get(key) for key in READY})

    off, on = dict.fromkeys(READY), READY
    assert seen == [off, off, on, off, on, off]
    assert node["metadata"]["labels"]["team"] == "ml"


def test_the_labels_stay_through_a_driver_reload_that_keeps_the_spec() -> None:
    unloaded = inventory(gpus=0, container_runtimes=(CONTAINERD,), cdi_specs=(SPEC,))

    assert READY.items() <= labeling.labels_for(unloaded).items()


def test_an_inventory_without_runtimes_or_specs_hashes_as_before_the_fields() -> None:
    plain = inventory()
    before = plain.model_dump(
        mode="json",
        exclude={"inventory_hash": True, **dict.fromkeys(_ADDED, True), "gpus": _GPU_ADDED},
    )

    assert plain.content_hash() == _sha256(before)
    assert inventory(cdi_specs=(SPEC,)).content_hash() != plain.content_hash()


def test_an_inventory_written_before_the_fields_parses_with_its_hash(host: HostRoot) -> None:
    scanned = scanning.scan(host, None)
    old = scanned.model_dump(mode="json", exclude=set(_ADDED))
    old_json = json.dumps({**old, "inventory_hash": _sha256(_without(old, "inventory_hash"))})

    parsed = Inventory.model_validate_json(old_json)

    assert (parsed.container_runtimes, parsed.cdi_specs) == ((), ())
    assert parsed.inventory_hash == parsed.content_hash() == scanned.inventory_hash


_ADDED = ("container_runtimes", "cdi_specs")
_GPU_ADDED = {"__all__": {"mig_devices"}}
"""`Gpu.mig_devices`, added later still, left out of each GPU's dump."""


def _sha256(fields: dict[str, object]) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _without(fields: dict[str, object], key: str) -> dict[str, object]:
    return {name: value for name, value in fields.items() if name != key}


def _apply(node: dict[str, object], patch: dict[str, dict[str, dict[str, str | None]]]) -> None:
    metadata = node["metadata"]
    assert isinstance(metadata, dict)
    for section in ("labels", "annotations"):
        current = metadata.setdefault(section, {})
        for key, value in patch["metadata"].get(section, {}).items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
