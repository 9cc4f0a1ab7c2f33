"""Discovery's reader of the CDI specs on a node: present, absent, malformed and partial
specs, in both spec directories; nothing a file holds stops the scan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuop.host import cdi_specs
from gpuop.host.roots import HostRoot
from tests.support.container_runtimes import SPEC, spec_document, write, write_spec


@pytest.fixture
def root(tmp_path: Path) -> HostRoot:
    return HostRoot(tmp_path)


def test_a_host_without_spec_directories_has_no_specs(root: HostRoot) -> None:
    assert cdi_specs.read_specs(root) == ()


def test_a_generated_spec_gives_its_version_and_devices(root: HostRoot) -> None:
    write_spec(root, gpus=2)

    [spec] = cdi_specs.read_specs(root)

    assert spec == cdi_specs.SpecFile(
        path="/var/run/cdi/nvidia.com-gpu.json",
        kind="nvidia.com/gpu",
        cdi_version="0.5.0",
        device_names=("0", "1", "all"),
    )
    assert spec.valid


def test_yaml_specs_are_read_and_static_ones_come_first(root: HostRoot) -> None:
    document = spec_document(1, cdi_version="0.6.0")
    write(root, "etc/cdi/nvidia.yaml", yaml.safe_dump(document))
    write_spec(root, gpus=2)

    found = cdi_specs.read_specs(root)

    assert [(spec.path, spec.cdi_version, len(spec.device_names)) for spec in found] == [
        ("/etc/cdi/nvidia.yaml", "0.6.0", 2),
        ("/var/run/cdi/nvidia.com-gpu.json", "0.5.0", 3),
    ]


def test_other_kinds_and_other_file_names_are_left_out(root: HostRoot) -> None:
    write_spec(root, relative="var/run/cdi/vendor.json", kind="example.com/fpga")
    write_spec(root, relative="var/run/cdi/nvidia.yml")
    write_spec(root, relative="var/run/cdi/nvidia.json.previous")
    write_spec(root, relative="var/run/cdi/sub/nvidia.json")

    assert cdi_specs.read_specs(root) == ()


def test_a_var_run_linked_to_run_is_followed_inside_the_host_root(root: HostRoot) -> None:
    (root.path / "run").mkdir()
    (root.path / "var").mkdir()
    (root.path / "var" / "run").symlink_to("/run")
    write_spec(root, relative="run/cdi/nvidia.com-gpu.json")

    [spec] = cdi_specs.read_specs(root)

    assert spec.path == "/var/run/cdi/nvidia.com-gpu.json"
    assert spec.valid


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{", "not JSON"),
        ("", "not JSON"),
        ("[]", "not a mapping"),
        ('{"cdiVersion": "0.5.0", "devices": []}', "kind None is not <vendor>/<class>"),
        ('{"cdiVersion": "0.5.0", "kind": "nvidia", "devices": []}', "is not <vendor>/<class>"),
    ],
)
def test_a_spec_that_does_not_parse_is_reported_with_unknown_kind(
    root: HostRoot, content: str, reason: str
) -> None:
    write(root, SPEC, content)

    [spec] = cdi_specs.read_specs(root)

    assert spec.kind is None
    assert not spec.valid
    assert reason in (spec.error or "")
    assert spec.device_names == ()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"cdiVersion": "latest"}, "cdiVersion 'latest' is not semver"),
        ({"cdiVersion": None}, "cdiVersion None is not semver"),
        ({"devices": []}, "defines no devices"),
        ({"devices": "0"}, "defines no devices"),
        ({"devices": [{"name": "0"}]}, "device '0' has no containerEdits"),
        ({"devices": [{"containerEdits": {}}]}, "device 0 has no valid name"),
        ({"devices": [{"name": "-bad", "containerEdits": {}}]}, "device 0 has no valid name"),
        ({"devices": ["0"]}, "device 0 is not a mapping"),
        (
            {"devices": [{"name": "0", "containerEdits": {}}, {"name": "0", "containerEdits": {}}]},
            "device '0' is defined twice",
        ),
        ({"containerEdits": []}, "containerEdits is not a mapping"),
    ],
)
def test_a_partial_spec_of_the_kind_is_reported_invalid_with_its_reason(
    root: HostRoot, change: dict[str, object], reason: str
) -> None:
    write(root, SPEC, json.dumps({**spec_document(2), **change}))

    [spec] = cdi_specs.read_specs(root)

    assert spec.kind == "nvidia.com/gpu"
    assert not spec.valid
    assert spec.error is not None and reason in spec.error
    assert spec.device_names == ()


def test_a_bad_yaml_a_binary_file_and_a_huge_file_are_reported_not_raised(
    root: HostRoot,
) -> None:
    write(root, "etc/cdi/broken.yaml", "kind: [unclosed\n")
    write(root, "etc/cdi/binary.json", "")
    root.join("etc/cdi/binary.json").write_bytes(b"\xff\xfe\x00")
    with root.join("etc/cdi/huge.json").open("wb") as stream:
        stream.truncate(cdi_specs.MAX_SPEC_BYTES + 1)
    write_spec(root)

    found = {spec.path: spec for spec in cdi_specs.read_specs(root)}

    assert "not YAML" in (found["/etc/cdi/broken.yaml"].error or "")
    assert "not UTF-8" in (found["/etc/cdi/binary.json"].error or "")
    assert "more than" in (found["/etc/cdi/huge.json"].error or "")
    assert found["/var/run/cdi/nvidia.com-gpu.json"].valid


def test_an_unreadable_spec_directory_is_no_spec_directory(root: HostRoot) -> None:
    write(root, "etc/cdi", "a file where the directory belongs")
    write_spec(root)

    [spec] = cdi_specs.read_specs(root)

    assert spec.path == "/var/run/cdi/nvidia.com-gpu.json"
