"""Image layers (`tests.support.images.layers`): the same tree gives the same bytes whatever
its files' times, owners and creation order; what differs in content or mode changes them."""

from __future__ import annotations

import gzip
import hashlib
import os
import socket
import tarfile
from pathlib import Path

import pytest

from tests.support.images.layers import Layer, file_digest, write_layer


def make_tree(root: Path, order: list[str], mtime: int) -> Path:
    root.mkdir()
    files = {"usr/bin/tool": (b"#!/bin/sh\n", 0o755), "etc/passwd": (b"root:x:0:0\n", 0o644),
             "usr/lib/libz.so.1.2": (b"\x7fELF", 0o644), "a": (b"", 0o600)}  # fmt: skip
    for name in order:
        content, mode = files[name]
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    (root / "usr/lib/libz.so.1").symlink_to("libz.so.1.2")
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    if os.geteuid() == 0:  # the build machine's owners never reach the layer
        os.chown(root / "etc/passwd", 1234, 5678)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


ORDER = ["usr/bin/tool", "etc/passwd", "usr/lib/libz.so.1.2", "a"]


def layer_of(tmp_path: Path, name: str, order: list[str], mtime: int) -> Layer:
    tree = make_tree(tmp_path / name, order, mtime)
    return write_layer(tree, tmp_path / f"{name}.tar.gz", epoch=1_700_000_000)


def test_the_same_tree_gives_the_same_layer_whatever_its_times_and_order(tmp_path: Path) -> None:
    first = layer_of(tmp_path, "one", ORDER, mtime=1_000)
    second = layer_of(tmp_path, "two", list(reversed(ORDER)), mtime=2_000_000_000)

    assert first.path.read_bytes() == second.path.read_bytes()
    assert (first.digest, first.diff_id, first.size) == (second.digest, second.diff_id, second.size)
    assert first.digest == file_digest(first.path)
    assert first.size == first.path.stat().st_size
    tar = gzip.decompress(first.path.read_bytes())
    assert first.diff_id == f"sha256:{hashlib.sha256(tar).hexdigest()}"


def test_a_changed_content_or_mode_changes_the_layer(tmp_path: Path) -> None:
    base = layer_of(tmp_path, "base", ORDER, mtime=0)
    edited = make_tree(tmp_path / "edited", ORDER, mtime=0)
    (edited / "etc/passwd").write_bytes(b"root:x:0:0:\n")
    moded = make_tree(tmp_path / "moded", ORDER, mtime=0)
    (moded / "usr/bin/tool").chmod(0o700)

    for tree in (edited, moded):
        other = write_layer(tree, tmp_path / f"{tree.name}.tar.gz", epoch=1_700_000_000)
        assert other.diff_id != base.diff_id, tree.name


def test_entries_are_sorted_owned_by_root_and_stamped_with_the_epoch(tmp_path: Path) -> None:
    layer = layer_of(tmp_path, "tree", ORDER, mtime=5)

    raw = layer.path.read_bytes()
    assert raw[4:8] == b"\0\0\0\0", "gzip's header carries no time"
    assert raw[3] & 0x08 == 0, "nor a file name"
    with tarfile.open(layer.path) as archive:
        members = archive.getmembers()
    names = [member.name for member in members]
    assert names == ["a", "etc", "etc/passwd", "tmp", "usr", "usr/bin", "usr/bin/tool",
                     "usr/lib", "usr/lib/libz.so.1", "usr/lib/libz.so.1.2"]  # fmt: skip
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {
        (0, 0, "", "", 1_700_000_000)
    }
    found = {member.name: member for member in members}
    assert found["tmp"].mode == 0o1777 and found["usr/bin/tool"].mode == 0o755
    assert found["usr/lib/libz.so.1"].issym()
    assert found["usr/lib/libz.so.1"].linkname == "libz.so.1.2"


def test_a_socket_is_refused_and_no_layer_is_left(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", ORDER, mtime=0)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tree / "control.sock"))
        with pytest.raises(ValueError, match="only files, directories and symlinks"):
            write_layer(tree, tmp_path / "layer.tar.gz", epoch=0)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tree"], "nothing half written"
