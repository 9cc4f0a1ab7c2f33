"""`gpuop driver install|status|rollback`, the break glass: one driver-manager step on a
seeded simulated host (GPU driver 580.159.04 loaded) from a signed driver source served over
http, through the driver-manager's own code and records, with no bus; and its refusals."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuop.cli.main import main
from gpuop.host import packages
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager.state import STATE_FILE, StateLock
from gpuop_sim.host import keys
from tests.support.driver_manager import KERNEL, NEW, OLD, build_source, rewrite_index, seed
from tests.support.processes import free_port

NODE = "gpu-7"


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return seed(tmp_path / "host")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    build_source(tmp_path / "source")
    return tmp_path / "source"


@pytest.fixture
def url(source: Path) -> Iterator[str]:
    """`source` served at http://127.0.0.1:<port>/, as a mirror would serve it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=source))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def driver(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`gpuop driver <args>` on the simulated node; exit code, stdout, stderr."""
    code = main(["driver", *args, "--node", NODE, "--nvml", "sim:8"])
    out, err = capsys.readouterr()
    return code, out, err


def install(host: HostRoot, url: str, version: str, *extra: str) -> list[str]:
    return [
        "install",
        "--host-root",
        str(host.path),
        "--source",
        url,
        "--public-key",
        keys.PUBLIC_KEY,
        "--version",
        version,
        *extra,
    ]


def status(capsys: pytest.CaptureFixture[str], host: HostRoot, *extra: str) -> dict[str, Any]:
    code, out, err = driver(
        capsys, "status", "--host-root", str(host.path), "--output", "json", *extra
    )
    assert code == 0, err
    found: dict[str, Any] = json.loads(out)
    return found


def test_install_loads_the_new_version_through_the_driver_managers_steps(
    host: HostRoot, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = driver(capsys, *install(host, url, NEW, "--validate"))
    assert code == 0, err
    said = out.splitlines()
    assert said[0].startswith(f"installed: version {NEW}, sha256 ")
    assert said[1] == f"unloaded: version {OLD}, modules nvidia_uvm nvidia"
    assert said[2] == f"loaded: version {NEW}, modules nvidia nvidia_uvm"
    assert said[3] == f"validated: version {NEW}, devices 8"
    assert f"  previous   {OLD}" in said
    found = status(capsys, host)
    assert found["loaded"] == NEW
    assert found["modules_loaded"] == ["nvidia", "nvidia_uvm"]
    assert found["previous"] == OLD
    assert found["kernels"] == {KERNEL: {"running": True, "installed": [OLD, NEW], "active": NEW}}
    # recorded as the agent records commands, each answer marked as the CLI's
    state = json.loads(host.join(STATE_FILE).read_text())
    verbs = sorted(record["verb"] for record in state["commands"].values())
    assert verbs == ["install", "load", "unload", "validate"]
    assert {r["result"]["source"] for r in state["commands"].values()} == {
        f"/gpuop/driver-manager/{NODE}/cli"
    }
    assert state["components"]["gpu"]["loaded"] == NEW


def test_install_of_the_running_version_installs_and_loads_nothing_again(
    host: HostRoot, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = driver(capsys, *install(host, url, OLD, "--output", "json"))
    assert code == 0, err
    answer = json.loads(out)
    assert [step["event"] for step in answer["steps"]] == ["installed"]
    assert answer["status"]["loaded"] == OLD


def test_install_with_no_load_leaves_the_running_driver_alone(
    host: HostRoot, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = driver(capsys, *install(host, url, NEW, "--no-load"))
    assert code == 0, err
    found = status(capsys, host)
    assert found["loaded"] == OLD
    assert found["kernels"][KERNEL] == {"running": True, "installed": [OLD, NEW], "active": OLD}


def test_rollback_returns_to_the_version_that_ran_before_and_removes_the_rejected_one(
    host: HostRoot, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert driver(capsys, *install(host, url, NEW))[0] == 0
    code, out, err = driver(capsys, "rollback", "--host-root", str(host.path), "--validate")
    assert code == 0, err
    assert out.splitlines()[:2] == [
        f"rolled-back: version {OLD}, from_version {NEW}",
        f"validated: version {OLD}, devices 8",
    ]
    found = status(capsys, host)
    assert (found["loaded"], found["previous"]) == (OLD, NEW)
    assert found["kernels"][KERNEL]["installed"] == [OLD]
    # back again: the rejected version is gone, and no source was named to fetch it
    code, _, err = driver(capsys, "rollback", "--host-root", str(host.path))
    assert code == 1
    assert f"gpu {NEW} is not installed and no driver source is known" in err
    code, _, err = driver(
        capsys,
        "rollback",
        "--host-root",
        str(host.path),
        "--source",
        url,
        "--public-key",
        keys.PUBLIC_KEY,
    )
    assert code == 0, err
    assert status(capsys, host)["loaded"] == NEW


def test_status_lists_every_kernel_and_filters_by_one(
    host: HostRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    other = "6.19.2-fc-v700-gpu"
    packages.install_standins(host, "gpu", NEW, other)  # pre-staged for a pending reboot
    found = status(capsys, host)
    assert found["running_kernel"] == KERNEL
    assert found["userspace"] is None
    assert found["kernels"] == {
        KERNEL: {"running": True, "installed": [OLD], "active": OLD},
        other: {"running": False, "installed": [NEW], "active": NEW},
    }
    assert list(status(capsys, host, "--kernel", other)["kernels"]) == [other]
    code, out, _ = driver(capsys, "status", "--host-root", str(host.path))
    assert code == 0
    assert f"  {KERNEL} (running): installed {OLD}; active {OLD}" in out.splitlines()
    assert f"  {other}: installed {NEW}; active {NEW}" in out.splitlines()
    code, _, err = driver(capsys, "status", "--host-root", str(host.path), "--kernel", "5.0.0")
    assert code == 2
    assert f"the host has no lib/modules/5.0.0 (it has: {KERNEL}, {other})" in err


def test_a_version_the_source_lacks_fails_naming_the_versions_it_has(
    host: HostRoot, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = driver(capsys, *install(host, url, "590.1.1"))
    assert code == 1
    assert out.startswith("install-failed: ")
    assert f"has no gpu 590.1.1 package: no such version (it has: {OLD}, {NEW})" in err
    assert status(capsys, host)["loaded"] == OLD, "nothing was unloaded"


def test_a_failed_step_in_json_gives_its_answer_and_a_key_file_is_read(
    host: HostRoot, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "gpuop.pub"
    key_file.write_text(f"untrusted comment: minisign public key\n{keys.PUBLIC_KEY}\n")
    args = install(host, url, "590.1.1", "--output", "json")
    args[args.index(keys.PUBLIC_KEY)] = str(key_file)
    code, out, err = driver(capsys, *args)
    assert code == 1
    (step,) = json.loads(out)["steps"]
    assert (step["event"], step["reason"], step["retryable"]) == (
        "install-failed",
        "not-found",
        False,
    )
    assert err.startswith("gpuop driver install: install failed: driver source ")
    code, _, err = driver(capsys, *install(host, url, NEW, "--public-key", str(tmp_path / "x.pub")))
    assert code == 2
    assert "--public-key " in err and "No such file or directory" in err


def test_a_tampered_index_and_a_wrong_digest_are_refused(
    host: HostRoot, url: str, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = driver(capsys, *install(host, url, NEW, "--sha256", "0" * 64))
    assert code == 1
    assert "the command expects " + "0" * 64 in err
    rewrite_index(source, {f"gpu-{NEW}-{KERNEL}.tar.gz": {"sha256": "1" * 64}}, sign=False)
    code, _, err = driver(capsys, *install(host, url, NEW))
    assert code == 1
    assert "signature" in err
    assert status(capsys, host)["kernels"][KERNEL]["installed"] == [OLD]


def test_bad_input_exits_2_naming_what_is_wrong(
    host: HostRoot, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        f"--host-root {tmp_path / 'nowhere'}: no such directory": [
            "status",
            "--host-root",
            str(tmp_path / "nowhere"),
        ],
        "--source 'ftp://mirror/drivers': expected an absolute directory": install(
            host, "ftp://mirror/drivers", NEW
        ),
        "--source 'drivers/': expected an absolute directory": install(host, "drivers/", NEW),
        "name the key the source's index is signed with (--public-key)": [
            "install",
            "--host-root",
            str(host.path),
            "--source",
            url,
            "--version",
            NEW,
        ],
        f"no version to roll gpu back to: the host's state records none before the last load; "
        f"name one with --version (installed: {OLD})": ["rollback", "--host-root", str(host.path)],
        f"--kernel 6.0.0: the host runs {KERNEL}": [*install(host, url, NEW), "--kernel", "6.0.0"],
    }
    for message, args in cases.items():
        code, _, err = driver(capsys, *args)
        assert (code, message in err) == (2, True), (args, err)
    assert status(capsys, host)["loaded"] == OLD


def test_an_unreachable_source_fails_and_changes_nothing(
    host: HostRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = driver(capsys, *install(host, f"http://127.0.0.1:{free_port()}/", NEW))
    assert code == 1
    assert "install failed: http://127.0.0.1:" in err
    assert status(capsys, host)["loaded"] == OLD
    lock = StateLock(host)
    assert lock.try_acquire(), "the failed install let the state lock go"
    lock.release()


def test_a_running_driver_manager_keeps_the_host_to_itself(
    host: HostRoot, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = StateLock(host)
    assert agent.try_acquire()
    try:
        code, _, err = driver(capsys, *install(host, url, NEW))
    finally:
        agent.release()
    assert code == 1
    assert "a driver-manager holds" in err
    assert status(capsys, host)["kernels"][KERNEL]["installed"] == [OLD]
