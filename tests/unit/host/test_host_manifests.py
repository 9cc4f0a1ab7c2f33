"""Package format 2: the manifest model and proto/packages' JSON Schema say the same, the
archive writer is reproducible, and a driver source's index takes v1 and v2 packages."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from gpuop.host import manifests, packaging, signing
from gpuop.host.manifests import Flavour, Role

SCHEMAS = Path(__file__).resolve().parents[3] / "proto" / "packages"
KERNEL = "6.1.0-57-amd64"
DIGEST = "ab" * 32


def valid() -> dict[str, Any]:
    return {
        "format": "gpuop-package/2",
        "component": "gpu",
        "version": "535.261.03",
        "flavour": "open",
        "kernel_release": KERNEL,
        "files": [
            {"path": "modules/nvidia.ko", "sha256": DIGEST, "mode": "0644", "role": "module"},
            {
                "path": "userspace/lib/libcuda.so.535.261.03",
                "sha256": DIGEST,
                "mode": "0644",
                "role": "library",
            },
            {
                "path": "userspace/bin/nvidia-smi",
                "sha256": DIGEST,
                "mode": "0755",
                "role": "binary",
            },
            {
                "path": "firmware/gsp_ga10x.bin",
                "sha256": DIGEST,
                "mode": "0644",
                "role": "firmware",
            },
        ],
        "links": [{"path": "userspace/lib/libcuda.so.1", "target": "libcuda.so.535.261.03"}],
        "built_from": [{"name": "libcuda1", "version": "535.261.03-1", "sha256": DIGEST}],
    }


def changed(path: str, value: Any) -> dict[str, Any]:
    """`valid()` with the field at dotted `path` set to `value` (or removed, for `...`)."""
    document = copy.deepcopy(valid())
    *parents, last = path.split(".")
    target: Any = document
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del target[key]
    else:
        target[key] = value
    return document


SCHEMA_FAULTS = {
    "no flavour": ("flavour", ..., "flavour"),
    "unknown flavour": ("flavour", "closed", "flavour"),
    "no files": ("files", [], "files"),
    "short digest": ("files.0.sha256", "abc", "files.0.sha256"),
    "numeric mode": ("files.0.mode", 420, "files.0.mode"),
    "unknown role": ("files.1.role", "plugin", "files.1.role"),
    "path outside the three directories": ("files.0.path", "nvidia.ko", "files.0.path"),
    "climbing path": ("files.0.path", "modules/../../etc/passwd", "files.0.path"),
    "extra key": ("signed_by", "me", "signed_by"),
    "bad kernel release": ("kernel_release", "6.1 amd64", "kernel_release"),
    "link target with a slash": ("links.0.target", "../libc.so", "links.0.target"),
}


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = json.loads((SCHEMAS / "manifest-v2.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [error.message for error in validator.iter_errors(document)]


def test_a_valid_manifest_passes_the_schema_and_the_installers_model() -> None:
    assert schema_errors(valid()) == []
    manifest = manifests.parse(json.dumps(valid()).encode())
    assert isinstance(manifest, manifests.ManifestV2)
    assert manifest.modules() == ("nvidia",)
    assert manifest.flavour is Flavour.OPEN
    assert json.loads(manifest.encode()) == valid()


@pytest.mark.parametrize("fault", sorted(SCHEMA_FAULTS))
def test_the_schema_and_the_model_refuse_the_same_faults_naming_the_field(fault: str) -> None:
    path, value, named = SCHEMA_FAULTS[fault]
    document = changed(path, value)
    assert schema_errors(document), f"the schema accepted {fault}"
    with pytest.raises(manifests.ManifestError) as refused:
        manifests.parse(json.dumps(document).encode(), "pkg.tar.gz: manifest.json")
    assert "pkg.tar.gz: manifest.json" in str(refused.value)
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("files.1.role", "module", "has role module, whose files go under modules/"),
        ("files.0.path", "modules/nvidia.o", "is not a .ko file"),
        ("files.2.mode", "0777", "0755 at most"),
        ("files.2.path", "modules/nvidia.ko", "listed twice"),
        ("links.0.target", "libcuda.so.999", "which the package does not hold"),
        ("format", "gpuop-package/3", "is not one this installer reads"),
    ],
)
def test_rules_beyond_the_schema_are_refused_with_a_reason(
    path: str, value: Any, words: str
) -> None:
    with pytest.raises(manifests.ManifestError, match=words.replace(".", r"\.")):
        manifests.parse(json.dumps(changed(path, value)).encode())


def test_a_manifest_that_is_not_json_or_not_an_object_is_refused() -> None:
    with pytest.raises(manifests.ManifestError, match="is not JSON"):
        manifests.parse(b"{nope")
    with pytest.raises(manifests.ManifestError, match="not a JSON object"):
        manifests.parse(b"[1]")


def test_format_1_manifests_still_parse_and_match_their_schema() -> None:
    v1 = {"component": "gpu", "version": "580.159.04", "kernel_release": KERNEL, "modules": []}
    assert isinstance(manifests.parse(json.dumps(v1).encode()), manifests.ManifestV1)
    schema = json.loads((SCHEMAS / "manifest-v1.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(v1)
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(valid()))


def write_inputs(directory: Path, mtime: int) -> dict[str, packaging.PackageContent]:
    directory.mkdir(parents=True)
    contents = {
        "modules/nvidia.ko": (b"\x7fELF nvidia", Role.MODULE, 0o644),
        "modules/nvidia-uvm.ko": (b"\x7fELF uvm", Role.MODULE, 0o644),
        "userspace/lib/libnvidia-ml.so.535.261.03": (b"nvml", Role.LIBRARY, 0o644),
        "userspace/bin/nvidia-smi": (b"smi", Role.BINARY, 0o755),
        "firmware/gsp_tu10x.bin": (b"gsp", Role.FIRMWARE, 0o644),
    }
    files = {}
    for number, (path, (data, role, mode)) in enumerate(sorted(contents.items())):
        file = directory / f"input-{number}"
        file.write_bytes(data)
        os.utime(file, (mtime, mtime))
        files[path] = packaging.PackageContent(file, role, mode)
    return files


def write(directory: Path, files: dict[str, packaging.PackageContent]) -> packaging.BuiltPackage:
    return packaging.write_package_v2(
        directory,
        component="gpu",
        version="535.261.03",
        flavour=Flavour.PROPRIETARY,
        kernel_release=KERNEL,
        files=files,
        links={"userspace/lib/libnvidia-ml.so.1": "libnvidia-ml.so.535.261.03"},
    )


def test_the_same_inputs_give_the_same_archive_whenever_and_wherever_written(
    tmp_path: Path,
) -> None:
    first = write(tmp_path / "out-a", write_inputs(tmp_path / "a", mtime=1_000_000))
    second = write(tmp_path / "out-b", write_inputs(tmp_path / "b", mtime=2_000_000))
    assert first.path.name == f"gpu-535.261.03-proprietary-{KERNEL}.tar.gz"
    assert first.sha256 == second.sha256 == packaging.sha256_of(second.path)
    with tarfile.open(first.path) as archive:
        members = archive.getmembers()
        names = [m.name for m in members]
        assert names == ["manifest.json", *sorted(names[1:])]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
        assert archive.getmember("userspace/bin/nvidia-smi").mode == 0o755
        manifest_file = archive.extractfile("manifest.json")
        assert manifest_file is not None
        manifest = manifests.parse(manifest_file.read())
    assert isinstance(manifest, manifests.ManifestV2)
    smi = next(f for f in manifest.files if f.path == "userspace/bin/nvidia-smi")
    assert (smi.sha256, smi.mode, smi.role) == (
        hashlib.sha256(b"smi").hexdigest(),
        "0755",
        Role.BINARY,
    )
    assert str(tmp_path) not in first.path.read_bytes().decode("latin-1")


def test_a_different_input_gives_a_different_archive(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "a", mtime=0)
    first = write(tmp_path / "out-a", files)
    (tmp_path / "a" / "input-0").write_bytes(b"changed")
    assert write(tmp_path / "out-b", files).sha256 != first.sha256


def test_a_package_whose_manifest_would_be_refused_is_not_written(tmp_path: Path) -> None:
    files = {"userspace/lib/libx.so": packaging.PackageContent(b"x", Role.LIBRARY)}
    with pytest.raises(manifests.ManifestError, match="lists no kernel module"):
        write(tmp_path / "out", files)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_the_index_keeps_format_1_and_2_packages_and_is_signed_again(tmp_path: Path) -> None:
    source = tmp_path / "source"
    key = signing.SecretKey.generate()
    (v1,) = packaging.build_driver_source(source, [("gpu", "580.159.04", KERNEL)], signing_key=key)
    v2 = write(source, write_inputs(tmp_path / "in", mtime=0))
    index = packaging.add_to_index(source, v2, key)
    assert index["packages"] == [v1.index_entry(), v2.index_entry()] or index["packages"] == [
        v2.index_entry(),
        v1.index_entry(),
    ]
    assert v2.index_entry()["flavour"] == "proprietary"
    signature = signing.Signature.parse((source / "index.json.minisig").read_bytes())
    signing.verify((source / "index.json").read_bytes(), signature, [key.public_key])
    # building it again replaces its entry; without a key the stale signature goes
    packaging.add_to_index(source, v2, None)
    entries = json.loads((source / "index.json").read_text())["packages"]
    assert len(entries) == 2
    assert not (source / "index.json.minisig").exists()


def test_an_index_that_is_not_one_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"pkgs": 1}')
    built = write(tmp_path, write_inputs(tmp_path / "in", mtime=0))
    with pytest.raises(ValueError, match="is not a driver source index"):
        packaging.add_to_index(tmp_path, built, None)
    assert (tmp_path / "index.json").read_text() == '{"pkgs": 1}'


def test_the_index_is_signed_with_a_minisign_key_file(tmp_path: Path) -> None:
    key = packaging.write_key_pair(tmp_path / "keys/gpuop.key", tmp_path / "keys/gpuop.pub")
    built = write(tmp_path / "source", write_inputs(tmp_path / "in", mtime=0))
    packaging.add_to_index(tmp_path / "source", built, tmp_path / "keys/gpuop.key")
    signature = signing.Signature.parse((tmp_path / "source/index.json.minisig").read_bytes())
    index = (tmp_path / "source/index.json").read_bytes()
    assert signing.verify(index, signature, [key.public_key]).key_id_hex
