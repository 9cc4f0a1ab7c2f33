"""The real control plane's launcher where it must fail clearly, without Go or the built
tools: a missing tool names `make cluster-tools`, a component that exits at start is
reported with its log, and a stopped plane leaves no process behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.support import control_plane
from tests.support.control_plane import ControlPlane, ControlPlaneError
from tests.support.processes import gone


def fake_tools(directory: Path, scripts: dict[str, str]) -> Path:
    """A bin directory of shell scripts standing in for the Go tools."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in control_plane.BINARIES:
        path = directory / name
        path.write_text("#!/bin/sh\n" + scripts.get(name, "exec sleep 600\n"))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


def test_a_missing_tool_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_plane, "BIN", tmp_path / "empty")

    with pytest.raises(ControlPlaneError, match="make cluster-tools") as raised:
        ControlPlane(tmp_path / "work").start()

    assert "etcd" in str(raised.value)
    assert control_plane.missing_tools() == [*control_plane.BINARIES, "kubectl"]


def test_a_component_that_exits_at_start_is_reported_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = {"kube-apiserver": "echo 'E1201 bad flag --nope' >&2\nexit 3\n"}
    monkeypatch.setattr(control_plane, "BIN", fake_tools(tmp_path / "bin", scripts))

    plane = ControlPlane(tmp_path / "work", kwok=False, controllers=False)
    with pytest.raises(ControlPlaneError, match="kube-apiserver exited 3") as raised, plane:
        pass

    assert "bad flag --nope" in str(raised.value)


def test_an_apiserver_that_never_answers_times_out_and_everything_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_plane, "BIN", fake_tools(tmp_path / "bin", {}))
    plane = ControlPlane(tmp_path / "work", kwok=False, controllers=False)
    pids: list[int] = []
    original = plane._spawn

    def spawn(name: str, arguments: list[str]) -> None:
        original(name, arguments)
        pids.append(plane.components[-1].process.pid)

    monkeypatch.setattr(plane, "_spawn", spawn)
    monkeypatch.setattr(control_plane, "START_TIMEOUT", 1.0)

    with pytest.raises(ControlPlaneError, match="not ready within 1 s"), plane:
        pass

    assert len(pids) == 2  # etcd and kube-apiserver were started
    assert all(gone(pid) for pid in pids), [pid for pid in pids if not gone(pid)]
    assert plane.components == []


def test_the_pki_serves_loopback_and_the_admin_is_in_system_masters(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    pki = control_plane.Pki.create(tmp_path / "pki")
    serving = x509.load_pem_x509_certificate(pki.cert("apiserver").read_bytes())
    admin = x509.load_pem_x509_certificate(pki.cert("admin").read_bytes())
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value

    assert "127.0.0.1" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    organisation = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [attribute.value for attribute in organisation] == ["system:masters"]
    assert os.stat(pki.key("admin")).st_size > 0
