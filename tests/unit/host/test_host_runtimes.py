"""The container runtime drop-ins (`gpuop.host.runtimes`), their application with a restart
(`gpuop.host.restarting`) and `gpuop runtime configure`, on small host roots. The real
parsers read the same drop-ins in tests/integration/host/test_host_runtime_parsers.py."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpuop.cli import main
from gpuop.clocks import VirtualClock
from gpuop.host import restarting, runtimes, tomlfiles
from gpuop.host.errors import HostReadError
from gpuop.host.restarting import RuntimeRestartFailed
from gpuop.host.roots import HostRoot
from gpuop.host.runtimes import Runtime, RuntimeConfigError
from tests.unit.host.support import make_root

MAIN_V2 = """\
# the node's own config; every byte of it stays
version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""
MAIN_V3 = """\
version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""
CRIO_MAIN = """\
[crio.runtime]
default_runtime = "crun"

[crio.runtime.runtimes.crun]
runtime_path = "/usr/libexec/crio/crun"
monitor_path = "/usr/libexec/crio/conmon"
"""


def containerd_root(tmp_path: Path, main: str = MAIN_V2) -> HostRoot:
    return make_root(tmp_path, {runtimes.CONTAINERD_CONFIG: main})


def fake_containerd(root: HostRoot, script: str) -> None:
    """A `usr/bin/containerd` under `root` that runs one line of shell."""
    fake = root.join("usr/bin/containerd")
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)


def read(root: HostRoot, relative: str) -> str:
    return root.join(relative).read_text()


def test_containerd_v2_drop_in_keeps_the_main_cri_table_and_adds_the_cdi_handler(
    tmp_path: Path,
) -> None:
    root = containerd_root(tmp_path)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    assert planned.config_version == 2
    drop_in = tomllib.loads(planned.drop_in_text)
    cri = drop_in["plugins"]["io.containerd.grpc.v1.cri"]
    assert drop_in["version"] == 2
    assert cri["enable_cdi"] is True
    assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    # containerd 1.x replaces the whole CRI table with an imported one: the rest is repeated
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    assert nvidia == {"runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": True}}


def test_containerd_v3_drop_in_holds_only_what_it_adds(tmp_path: Path) -> None:
    root = containerd_root(tmp_path, MAIN_V3)
    planned = runtimes.plan(root, Runtime.CONTAINERD, runtime_path="/usr/bin/nvidia-runc")
    drop_in = tomllib.loads(planned.drop_in_text)
    assert planned.config_version == 3
    assert drop_in["version"] == 3
    cri = drop_in["plugins"]["io.containerd.cri.v1.runtime"]
    # on by default since 2.0, and a key 2.4 no longer knows (it warns)
    assert "enable_cdi" not in cri
    assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert cri["containerd"]["runtimes"] == {
        "nvidia": {
            "runtime_type": "io.containerd.runc.v2",
            "options": {"BinaryName": "/usr/bin/nvidia-runc"},
        }
    }


def test_a_v3_main_config_that_turned_cdi_off_is_overruled(tmp_path: Path) -> None:
    main = MAIN_V3.replace("version = 3\n", "version = 3\n").replace(
        "[plugins.",
        '[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n\n[plugins.',
        1,
    )
    planned = runtimes.plan(containerd_root(tmp_path, main), Runtime.CONTAINERD)
    cri = tomllib.loads(planned.drop_in_text)["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["enable_cdi"] is True


def test_a_v2_main_config_gives_its_runc_table_to_a_v3_drop_in(tmp_path: Path) -> None:
    root = containerd_root(tmp_path)
    fake_containerd(root, "echo containerd github.com/containerd/containerd/v2 v2.4.2")
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    cri = tomllib.loads(planned.drop_in_text)["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["containerd"]["runtimes"]["nvidia"]["options"] == {"SystemdCgroup": True}


def test_containerd_1x_with_a_version_1_config_is_refused(tmp_path: Path) -> None:
    root = containerd_root(tmp_path, "[grpc]\naddress = '/run/c.sock'\n")
    fake_containerd(root, "echo containerd github.com/containerd/containerd v1.7.27")
    with pytest.raises(RuntimeConfigError, match="set `version = 2`"):
        runtimes.plan(root, Runtime.CONTAINERD)


def test_import_line_is_added_once_and_every_other_byte_of_the_main_config_kept(
    tmp_path: Path,
) -> None:
    root = containerd_root(tmp_path)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    runtimes.apply(root, planned)
    after = read(root, runtimes.CONTAINERD_CONFIG)
    added = 'imports = ["conf.d/99-nvidia.toml"]\n'
    assert after == MAIN_V2.replace("version = 2\n", "version = 2\n" + added)
    assert read(root, runtimes.CONTAINERD_DROP_IN) == planned.drop_in_text
    again = runtimes.plan(root, Runtime.CONTAINERD)
    assert not again.changed
    assert again.drop_in_text == planned.drop_in_text


@pytest.mark.parametrize(
    ("imports", "expected"),
    [
        (
            'imports = ["/etc/containerd/extra/*.toml"]\n',
            'imports = ["conf.d/99-nvidia.toml", "/etc/containerd/extra/*.toml"]\n',
        ),
        ("imports = [\n]\n", 'imports = ["conf.d/99-nvidia.toml"\n]\n'),
        ('imports = ["/etc/containerd/conf.d/*.toml"]\n', None),
        ('imports = ["conf.d/*.toml"]\n', None),
    ],
)
def test_an_existing_imports_array_gets_the_drop_in_unless_a_glob_covers_it(
    tmp_path: Path, imports: str, expected: str | None
) -> None:
    main = "version = 2\n" + imports + "\n[grpc]\naddress = '/run/containerd/containerd.sock'\n"
    root = containerd_root(tmp_path, main)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    main_changes = [c for c in planned.changes if c.relative == runtimes.CONTAINERD_CONFIG]
    if expected is None:
        assert main_changes == []
    else:
        assert main_changes[0].after == main.replace(imports, expected)


def test_a_main_config_without_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    root = containerd_root(tmp_path, "[grpc]\naddress = '/run/c.sock'\n")
    with pytest.raises(RuntimeConfigError, match=r"config\.toml: config version None"):
        runtimes.plan(root, Runtime.CONTAINERD)


def test_a_binary_of_2x_chooses_version_3_over_the_main_config(tmp_path: Path) -> None:
    root = containerd_root(tmp_path)
    fake_containerd(root, "echo containerd github.com/containerd/containerd/v2 v2.4.2 x")
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    assert (planned.config_version, planned.runtime_version) == (3, "2.4.2")
    assert planned.notes == ()


def test_containerd_16_is_told_it_has_no_cdi(tmp_path: Path) -> None:
    root = containerd_root(tmp_path)
    fake_containerd(root, "echo containerd github.com/containerd/containerd 1.6.20~ds1")
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    assert (planned.config_version, planned.runtime_version) == (2, "1.6.20")
    assert "no CDI" in planned.notes[0]


def test_a_binary_that_fails_leaves_the_choice_to_the_main_config(tmp_path: Path) -> None:
    root = containerd_root(tmp_path, MAIN_V3)
    fake_containerd(root, "exit 3")
    assert runtimes.plan(root, Runtime.CONTAINERD).config_version == 3


def test_no_containerd_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeConfigError, match=r"no containerd config found at .*config\.toml"):
        runtimes.plan(HostRoot(tmp_path), Runtime.CONTAINERD)


def test_unparsable_toml_names_the_file_and_line(tmp_path: Path) -> None:
    root = containerd_root(tmp_path, "version = 2\n\n[plugins\nroot = 1\n")
    with pytest.raises(HostReadError, match=r"etc/containerd/config\.toml: line 3: not valid"):
        runtimes.plan(root, Runtime.CONTAINERD)


def test_crio_drop_in_copies_the_default_runtime_and_names_the_cdi_dirs(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        {runtimes.CRIO_CONFIG: CRIO_MAIN, "etc/crio/crio.conf.d/10-site.conf": "[crio]\n"},
    )
    planned = runtimes.plan(root, Runtime.CRIO)
    assert planned.drop_in == "etc/crio/crio.conf.d/99-nvidia.conf"
    document = tomllib.loads(planned.drop_in_text)
    assert document["crio"]["runtime"]["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert document["crio"]["runtime"]["runtimes"]["nvidia"] == {
        "runtime_path": "/usr/libexec/crio/crun",
        "monitor_path": "/usr/libexec/crio/conmon",
    }
    runtimes.apply(root, planned)
    assert not runtimes.plan(root, Runtime.CRIO).changed


def test_crio_without_a_runtime_table_uses_the_hosts_oci_runtime(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"etc/crio/crio.conf.d/.keep": "", "usr/bin/runc": ""})
    document = tomllib.loads(runtimes.plan(root, Runtime.CRIO).drop_in_text)
    assert document["crio"]["runtime"]["runtimes"]["nvidia"] == {
        "runtime_path": "/usr/bin/runc",
        "runtime_type": "oci",
    }


def test_no_crio_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeConfigError, match="no CRI-O found"):
        runtimes.plan(HostRoot(tmp_path), Runtime.CRIO)


def test_a_relative_runtime_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not absolute"):
        runtimes.plan(containerd_root(tmp_path), Runtime.CONTAINERD, runtime_path="nvidia")


def test_undo_restores_the_main_config_byte_for_byte_and_removes_the_drop_in(
    tmp_path: Path,
) -> None:
    root = containerd_root(tmp_path)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    runtimes.apply(root, planned)
    runtimes.undo(root, planned)
    assert read(root, runtimes.CONTAINERD_CONFIG) == MAIN_V2
    assert not root.join(runtimes.CONTAINERD_DROP_IN).exists()


def test_the_toml_writer_round_trips_what_configs_hold() -> None:
    document = {
        "version": 2,
        "plain": {"s": 'q"\\\n\tx', "f": 1.5, "b": False, "a": [1, "two"], "e": {}},
        "odd key.x": {"inline": [{"k": 1}], "tables": {"x": True}},
        "arr": [{"name": "a", "deep": {"k": "v"}}, {"name": "b"}],
    }
    assert tomllib.loads(tomlfiles.dumps(document)) == document


class FakeRuntime:
    """A runtime that restarts and answers as told, recording what it was asked."""

    def __init__(self, *, answers_after: int | None, fails_restart: bool = False) -> None:
        self.answers_after = answers_after
        self.fails_restart = fails_restart
        self.restarts = 0
        self.polls = 0

    async def restart(self, runtime: Runtime) -> None:
        self.restarts += 1
        self.polls = 0
        if self.fails_restart and self.restarts == 1:
            raise RuntimeRestartFailed("systemctl restart containerd failed (1)", restored=False)

    async def answering(self, runtime: Runtime) -> bool:
        self.polls += 1
        if self.restarts > 1:  # the earlier configuration always comes back
            return True
        return self.answers_after is not None and self.polls > self.answers_after


async def test_configure_restarts_once_and_a_second_apply_is_a_no_op(tmp_path: Path) -> None:
    root = containerd_root(tmp_path)
    service = FakeRuntime(answers_after=3)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    applied = await restarting.configure(root, planned, service, VirtualClock(), 30)
    assert applied.changed
    assert applied.waited_seconds == pytest.approx(3 * restarting.POLL_SECONDS)
    assert service.restarts == 1
    again = await restarting.configure(
        root, runtimes.plan(root, Runtime.CONTAINERD), service, VirtualClock(), 30
    )
    assert not again.changed
    assert service.restarts == 1


async def test_a_runtime_that_does_not_come_back_is_restored_and_fails(tmp_path: Path) -> None:
    root = containerd_root(tmp_path)
    service = FakeRuntime(answers_after=None)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    with pytest.raises(RuntimeRestartFailed, match="did not answer within 10 s") as failure:
        await restarting.configure(root, planned, service, VirtualClock(), 10)
    assert failure.value.restored
    assert "earlier configuration restored" in failure.value.reason
    assert service.restarts == 2
    assert read(root, runtimes.CONTAINERD_CONFIG) == MAIN_V2
    assert not root.join(runtimes.CONTAINERD_DROP_IN).exists()


async def test_a_restart_that_fails_is_restored_with_its_reason(tmp_path: Path) -> None:
    root = make_root(tmp_path, {runtimes.CRIO_CONFIG: CRIO_MAIN})
    service = FakeRuntime(answers_after=0, fails_restart=True)
    with pytest.raises(RuntimeRestartFailed, match="systemctl restart containerd failed"):
        await restarting.configure(
            root, runtimes.plan(root, Runtime.CRIO), service, VirtualClock(), 10
        )
    assert not root.join(runtimes.CRIO_DROP_IN).exists()


def test_socket_answers_only_when_something_listens(tmp_path: Path) -> None:
    import socket

    path = str(tmp_path / "c.sock")
    assert not restarting.socket_answers(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        assert restarting.socket_answers(path)


def test_cli_dry_run_prints_the_drop_in_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = containerd_root(tmp_path)
    argv = ["runtime", "configure", "--host-root", str(tmp_path), "--runtime", "containerd"]
    assert main.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]' in out
    assert '+imports = ["conf.d/99-nvidia.toml"]' in out
    assert read(root, runtimes.CONTAINERD_CONFIG) == MAIN_V2
    assert not root.join("etc/containerd/conf.d").exists()
    assert main.main(argv) == 0
    assert root.join(runtimes.CONTAINERD_DROP_IN).exists()
    assert main.main(argv) == 0
    assert "already configured" in capsys.readouterr().out


def test_cli_names_the_unparsable_file_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_root(tmp_path, {runtimes.CRIO_CONFIG: "[crio.runtime\n"})
    argv = ["runtime", "configure", "--host-root", str(tmp_path), "--runtime", "crio"]
    assert main.main(argv) == 1
    assert "crio.conf: line 1: not valid TOML" in capsys.readouterr().err


async def test_systemd_restart_that_cannot_run_fails_naming_the_command(tmp_path: Path) -> None:
    # an empty host root has no systemctl: chroot fails, as on a node without systemd
    service = restarting.SystemdRuntimeService(HostRoot(tmp_path), timeout=10)
    assert service.command(Runtime.CRIO) == (
        "chroot",
        str(tmp_path),
        "systemctl",
        "restart",
        "crio",
    )
    with pytest.raises(RuntimeRestartFailed, match=r"systemctl restart containerd failed \("):
        await service.restart(Runtime.CONTAINERD)
    assert not await service.answering(Runtime.CONTAINERD)


def test_cli_restart_that_fails_puts_the_files_back_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = containerd_root(tmp_path)
    argv = ["runtime", "configure", "--host-root", str(tmp_path), "--runtime", "containerd"]
    assert main.main([*argv, "--restart", "--timeout", "1"]) == 1
    assert "systemctl restart containerd failed" in capsys.readouterr().err
    assert read(root, runtimes.CONTAINERD_CONFIG) == MAIN_V2
    assert not root.join(runtimes.CONTAINERD_DROP_IN).exists()
