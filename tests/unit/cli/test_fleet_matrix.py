"""`gpuop.cli.matrix`, pure: each node's package (version, flavour, kernel, architecture),
the flavour `auto` resolves to from the node's inventory, one row per package, and the build
command of each row or why none can make it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuop.cli import coverage, matrix, snapshots
from gpuop.events.driver import Component
from gpuop.events.hardware import HardwareDiscovered
from gpuop.policy import validation
from gpuop.services.driver_manager import facade as driver_manager
from tests.support.inventories import one_gpu

NEW, OLD = "535.261.03", "535.216.01"
SOURCE = "/srv/drivers"


def snapshot(
    *views: snapshots.NodeView, kernel_module_type: str = "auto", ofed: bool = False
) -> snapshots.Snapshot:
    driver: dict[str, Any] = {
        "gpu": {"version": NEW, "source": SOURCE, "kernelModuleType": kernel_module_type}
    }
    if ofed:
        driver["ofed"] = {"version": "24.10-1.1.4.0", "source": SOURCE}
    spec = validation.validate_spec({"driver": driver})
    return snapshots.Snapshot(
        policy=snapshots.PolicyView("default", spec), nodes={v.name: v for v in views}
    )


def inventory(device_id: str, machine: str = "x86_64") -> HardwareDiscovered:
    return one_gpu(device_id, kernel="6.1.0-57-amd64", machine=machine)


def view(name: str, kernel: str = "6.1.0-57-amd64", **fields: Any) -> snapshots.NodeView:
    return snapshots.NodeView(name, kernel=kernel, **{"driver": OLD, **fields})


@pytest.mark.parametrize(
    ("node", "arch"),
    [
        (view("a", labels={matrix.ARCH_LABEL: "arm64"}), "arm64"),
        (view("b", inventory=inventory("2901", machine="aarch64")), "arm64"),
        (view("c", kernel="6.1.0-57-arm64"), "arm64"),
        (view("d", kernel="6.18.44-fc-v657-gpu"), "amd64"),
        (view("e", kernel="6.1.0-57-arm64", labels={matrix.ARCH_LABEL: "amd64"}), "amd64"),
    ],
)
def test_a_nodes_architecture_is_its_label_else_its_machine_else_its_kernels(
    node: snapshots.NodeView, arch: str
) -> None:
    assert matrix.architecture(node) == arch


def flavours_wanted(fleet: snapshots.Snapshot, *, decided_only: bool = False) -> dict[str, Any]:
    assert fleet.policy is not None and fleet.policy.spec is not None
    found = matrix.wanted(fleet, fleet.policy.spec, decided_only=decided_only)
    return {w.node: w.target.flavour for w in found}


def test_auto_resolves_from_the_nodes_gpus_else_by_the_branch() -> None:
    fleet = snapshot(
        view("blackwell", inventory=inventory("2901")),  # B200: open modules only
        view("hopper", inventory=inventory("2335")),  # H200 on 535: proprietary
        view("unseen"),
    )
    assert flavours_wanted(fleet) == {
        "blackwell": "open",
        "hopper": "proprietary",
        "unseen": "proprietary",
    }
    # upgrade start does not refuse on the guess: any flavour serves the unseen node
    assert flavours_wanted(fleet, decided_only=True)["unseen"] is None
    assert flavours_wanted(fleet, decided_only=True)["blackwell"] == "open"


def test_a_node_running_the_version_needs_nothing_and_source_replaces_the_policys() -> None:
    fleet = snapshot(view("done", driver=NEW), view("old"), kernel_module_type="open")
    assert fleet.policy is not None and fleet.policy.spec is not None
    found = matrix.wanted(fleet, fleet.policy.spec, source="/mnt/new")
    assert [(w.node, w.target.source) for w in found] == [("old", "/mnt/new")]


def test_nodes_needing_the_same_package_are_one_row_and_architectures_apart() -> None:
    fleet = snapshot(
        view("a"), view("b"), view("arm", kernel="6.1.0-57-arm64"), kernel_module_type="open"
    )
    assert fleet.policy is not None and fleet.policy.spec is not None
    wanted = matrix.wanted(fleet, fleet.policy.spec)
    rows = matrix.lacking(coverage.missing(wanted, {SOURCE: driver_manager.SourceIndex()}), fleet)
    assert [(r.kernel, r.arch, r.nodes) for r in rows] == [
        ("6.1.0-57-amd64", "amd64", ("a", "b")),
        ("6.1.0-57-arm64", "arm64", ("arm",)),
    ]
    assert rows[0].build_command() == (
        f"gpuop package build --from-debian --version {NEW} --flavour open "
        f"--kernel 6.1.0-57-amd64 --out {SOURCE}"
    )
    assert rows[1].build_command() == (
        f"gpuop package build --from-debian --version {NEW} --flavour open "
        f"--kernel 6.1.0-57-arm64 --arch arm64 --out {SOURCE}"
    )
    ppc = dataclasses.replace(rows[1], arch="ppc64le", kernel="6.1.0-57-powerpc64le")
    assert ppc.build_command() is None
    assert "builds amd64, arm64 only" in str(ppc.why_not_buildable())


def test_the_command_is_quoted_for_a_shell_and_none_where_gpuop_cannot_build() -> None:
    row = matrix.Package(Component.GPU, NEW, "open", "6.1.0-57-amd64", "amd64", "/srv/my d", ())
    assert str(row.build_command()).endswith("--out '/srv/my d'")
    ofed = matrix.Package(Component.OFED, "24.10", None, "6.1.0-57-amd64", "amd64", SOURCE, ())
    undecided = matrix.Package(Component.GPU, NEW, None, "6.1.0-57-amd64", "amd64", SOURCE, ())
    remote = matrix.Package(
        Component.GPU, NEW, "open", "6.1.0-57-amd64", "amd64", "https://x.example/d", ()
    )
    assert [p.build_command() for p in (ofed, undecided, remote)] == [None, None, None]
    assert "GPU drivers only" in str(ofed.why_not_buildable())
    assert "gpuop package plan --nats" in str(undecided.why_not_buildable())
    assert "publish" in str(remote.why_not_buildable())
