"""The image's Debian packages (`tests.support.images.debian`), without the network: the lock,
dependency relations and what IGNORED excuses, the SHA-256 check of a fetched .deb, and
unpacking packages built here with dpkg-deb into a merged-/usr tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuop.host.packaging import sha256_of
from tests.support.images import debian


def build_deb(tmp_path: Path, name: str, files: dict[str, bytes], depends: str = "") -> Path:
    source = tmp_path / f"{name}-source"
    (source / "DEBIAN").mkdir(parents=True)
    control = (
        f"Package: {name}\nVersion: 1.0-1\nArchitecture: amd64\nMaintainer: gpuop <x@y.z>\n"
        f"Description: a test package\n"
    )
    if depends:
        control += f"Depends: {depends}\n"
    (source / "DEBIAN/control").write_text(control)
    for relative, content in files.items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(content)
    deb = tmp_path / f"{name}_1.0-1_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(source), str(deb)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return deb


def test_relations_keep_names_and_alternatives_only() -> None:
    assert debian.relations("libc6 (>= 2.34), media-types | mime-support, python3:any") == [
        ["libc6"],
        ["media-types", "mime-support"],
        ["python3"],
    ]
    with pytest.raises(debian.DebianError, match="unreadable"):
        debian.relations("Bad Name (>= 1)")


def test_unmet_names_what_no_package_provides_and_ignored_does_not_excuse() -> None:
    controls = {
        "dash": "Package: dash\nPre-Depends: libc6 (>= 2.34)\nDepends: debianutils (>= 5.6)\n",
        "libc6": "Package: libc6\nDepends: libgcc-s1\n",
        "app": "Package: app\nDepends: mail-transport-agent | exim4, awk\n",
        "exim4": "Package: exim4\nProvides: mail-transport-agent\n",
        "tool": "Package: tool\nDepends: libmissing1 (>= 2) | libother,\n libgone\n",
    }

    assert debian.unmet(controls) == [
        "libc6: libgcc-s1",
        "tool: libmissing1 | libother",
        "tool: libgone",
    ]


def test_the_lock_reads_back_what_was_written(tmp_path: Path) -> None:
    pins = [
        debian.Pin("zlib1g", "1:1.2.13.dfsg-1", "amd64", "ab" * 32),
        debian.Pin("dash", "0.5", "all", "cd" * 32),
    ]
    debian.write_lock(pins, tmp_path / "debian.lock")

    assert debian.read_lock(tmp_path / "debian.lock") == tuple(sorted(pins, key=lambda p: p.name))


def test_the_committed_lock_pins_every_root_and_nothing_ignored() -> None:
    locked = {pin.name for pin in debian.read_lock()}

    assert set(debian.ROOTS) <= locked
    assert not locked & debian.IGNORED.keys()
    assert all(len(pin.sha256) == 64 and pin.version for pin in debian.read_lock())
    assert {pin.architecture for pin in debian.read_lock()} == {"amd64", "all"}


def test_a_pin_s_package_url_encodes_its_version() -> None:
    pin = debian.Pin("libattr1", "1:2.5.1-4+b1", "amd64", "0" * 64)

    assert pin.purl == "pkg:deb/debian/libattr1@1:2.5.1-4%2Bb1?arch=amd64"


def test_a_deb_whose_sha256_is_not_the_lock_s_is_refused_and_removed(tmp_path: Path) -> None:
    deb = build_deb(tmp_path, "tool", {"usr/bin/tool": b"x"})
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / deb.name).write_bytes(deb.read_bytes())

    right = debian.Pin("tool", "1.0-1", "amd64", sha256_of(deb))
    assert debian.download([right], cache) == {"tool": cache / deb.name}
    wrong = debian.Pin("tool", "1.0-1", "amd64", "0" * 64)
    with pytest.raises(debian.DebianError, match="SHA-256 is not the lock's"):
        debian.download([wrong], cache)
    assert not (cache / deb.name).exists()


def test_packages_unpack_into_merged_usr_with_a_dpkg_status(tmp_path: Path) -> None:
    debs = {
        "tool": build_deb(tmp_path, "tool", {"bin/tool": b"#!/bin/sh\n"}, depends="libfoo1"),
        "libfoo1": build_deb(tmp_path, "libfoo1", {"lib/x86_64-linux-gnu/libfoo.so.1": b"so",
                                                   "usr/share/man/man1/foo.1": b"man"}),
    }  # fmt: skip
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()

    debian.unpack(debs, rootfs)

    assert (rootfs / "bin").readlink() == Path("usr/bin")
    assert (rootfs / "usr/bin/tool").read_bytes() == b"#!/bin/sh\n"
    assert (rootfs / "usr/lib/x86_64-linux-gnu/libfoo.so.1").is_file()
    assert not (rootfs / "usr/share/man").exists()
    status = (rootfs / "var/lib/dpkg/status").read_text()
    assert status.count("Status: install ok installed") == 2
    assert status.index("Package: libfoo1") < status.index("Package: tool")


def test_a_missing_dependency_fails_the_unpack(tmp_path: Path) -> None:
    debs = {"tool": build_deb(tmp_path, "tool", {"bin/tool": b""}, depends="libfoo1")}
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()

    with pytest.raises(debian.DebianError, match="tool: libfoo1"):
        debian.unpack(debs, rootfs)


def test_two_packages_with_one_file_fail_the_unpack(tmp_path: Path) -> None:
    debs = {
        "one": build_deb(tmp_path, "one", {"bin/tool": b"1"}),
        "two": build_deb(tmp_path, "two", {"usr/bin/tool": b"2"}),
    }
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()

    with pytest.raises(debian.DebianError, match="two: /usr/bin/tool is another package's"):
        debian.unpack(debs, rootfs)


def test_the_ca_bundle_is_every_packaged_certificate_in_order(tmp_path: Path) -> None:
    mozilla = tmp_path / "usr/share/ca-certificates/mozilla"
    mozilla.mkdir(parents=True)
    (mozilla / "B.crt").write_bytes(b"-----B-----\n")
    (mozilla / "A.crt").write_bytes(b"-----A-----")

    bundle = debian.ca_bundle(tmp_path)
    assert bundle.read_bytes() == b"-----A-----\n-----B-----\n"
    with pytest.raises(debian.DebianError, match="no certificates"):
        debian.ca_bundle(tmp_path / "empty")
