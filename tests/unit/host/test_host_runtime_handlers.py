"""Discovery's reader of the node's container runtimes: which is installed, its version, and
whether its configuration, as it would load it, has the `nvidia` handler; present, absent,
malformed and partial configurations of containerd (config versions 2 and 3) and CRI-O."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuop.host import gobinaries, runtime_handlers
from gpuop.host.roots import HostRoot
from gpuop.host.runtime_handlers import Runtime, RuntimeState
from tests.support.container_runtimes import (
    CONTAINERD_DROP_IN,
    CONTAINERD_DROP_IN_V2,
    CONTAINERD_MAIN,
    CONTAINERD_MAIN_V2,
    CRIO_DROP_IN,
    CRIO_DROP_IN_PATH,
    CRIO_MAIN,
    CRIO_MAIN_PATH,
    DPKG_CONTAINERD,
    containerd_with_handler,
    write,
)


@pytest.fixture
def root(tmp_path: Path) -> HostRoot:
    return HostRoot(tmp_path)


def test_a_host_without_a_runtime_has_none(root: HostRoot) -> None:
    assert runtime_handlers.runtimes(root) == ()


def test_empty_configuration_directories_are_no_runtime(root: HostRoot) -> None:
    for directory in runtime_handlers.CONFIG_DIRECTORIES:
        root.join(directory).mkdir(parents=True, exist_ok=True)

    assert runtime_handlers.runtimes(root) == ()


def test_debian_containerd_with_the_version_2_drop_in_has_the_handler_but_no_cdi(
    root: HostRoot,
) -> None:
    write(root, runtime_handlers.DPKG_STATUS, DPKG_CONTAINERD)
    containerd_with_handler(root, version=2)

    assert runtime_handlers.runtimes(root) == (
        RuntimeState(
            Runtime.CONTAINERD,
            "1.6.20~ds1-1+deb12u3",
            nvidia_handler=True,
            config_files=("/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml"),
            cdi_enabled=False,  # 1.6 has no CDI; the drop-in's enable_cdi is ignored
        ),
    )


@pytest.mark.parametrize(
    ("version", "main", "switch", "enabled"),
    [
        ("1.6.20~ds1-1+deb12u3", 2, "true", False),
        ("1.7.22", 2, "true", True),
        ("1.7.22", 2, None, False),
        ("v2.1.4", 2, None, True),
        ("v2.1.4", 3, "false", False),
        (None, 2, "true", True),
        (None, 2, "false", False),
        (None, 2, None, None),
        (None, 3, None, True),
    ],
)
def test_whether_containerd_resolves_cdi_names(
    root: HostRoot, version: str | None, main: int, switch: str | None, enabled: bool | None
) -> None:
    if version is not None:
        status = DPKG_CONTAINERD.replace("1.6.20~ds1-1+deb12u3", version)
        write(root, runtime_handlers.DPKG_STATUS, status)
    plugin = "io.containerd.grpc.v1.cri" if main == 2 else "io.containerd.cri.v1.runtime"
    table = f'[plugins."{plugin}"]\n' + (f"enable_cdi = {switch}\n" if switch else "")
    write(root, CONTAINERD_MAIN, f"version = {main}\n{table}")

    [state] = runtime_handlers.runtimes(root)

    assert state.cdi_enabled is enabled


def test_containerd_without_a_config_runs_its_release_defaults(root: HostRoot) -> None:
    write(root, runtime_handlers.DPKG_STATUS, DPKG_CONTAINERD.replace("1.6.20~ds1", "2.0.5"))

    [state] = runtime_handlers.runtimes(root)

    assert (state.nvidia_handler, state.cdi_enabled) == (False, True)


def test_containerd_2_with_a_relative_import_and_the_version_3_drop_in(root: HostRoot) -> None:
    containerd_with_handler(root, version=3)

    [state] = runtime_handlers.runtimes(root)

    assert state.nvidia_handler
    assert state.version is None
    assert state.config_files[-1] == "/etc/containerd/conf.d/99-nvidia.toml"


def test_a_drop_in_the_main_config_does_not_import_is_not_loaded(root: HostRoot) -> None:
    write(root, CONTAINERD_MAIN, 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n')
    write(root, CONTAINERD_DROP_IN, CONTAINERD_DROP_IN_V2)

    [state] = runtime_handlers.runtimes(root)

    assert not state.nvidia_handler
    assert state.config_files == ("/etc/containerd/config.toml",)


def test_without_a_main_config_containerd_runs_its_defaults_without_the_handler(
    root: HostRoot,
) -> None:
    write(root, CONTAINERD_DROP_IN, CONTAINERD_DROP_IN_V2)
    write(root, "usr/bin/containerd", "not a Go binary")

    [state] = runtime_handlers.runtimes(root)

    assert state == RuntimeState(Runtime.CONTAINERD, None, nvidia_handler=False, cdi_enabled=None)


def test_on_containerd_1_a_later_import_of_the_cri_table_replaces_the_handler(
    root: HostRoot,
) -> None:
    # containerd#5837: an imported file's plugin table replaces the one before it whole
    write(root, runtime_handlers.DPKG_STATUS, DPKG_CONTAINERD)
    containerd_with_handler(root, version=2)
    later = '[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/opt/cni/bin"\n'
    write(root, "etc/containerd/conf.d/zz-cni.toml", later)

    [state] = runtime_handlers.runtimes(root)

    assert not state.nvidia_handler
    assert state.config_files[-1] == "/etc/containerd/conf.d/zz-cni.toml"


def test_on_containerd_2_tables_merge_and_the_handler_stays(root: HostRoot) -> None:
    containerd_with_handler(root, version=3)
    later = '[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "runc"\n'
    write(root, "etc/containerd/conf.d/zz-default.toml", later)

    [state] = runtime_handlers.runtimes(root)

    assert state.nvidia_handler


def test_containerd_1_6_globs_a_relative_import_from_its_working_directory(
    root: HostRoot,
) -> None:
    # as Debian's containerd 1.6.20 `config dump` does: `conf.d/*.toml` is looked for in `/`
    write(root, runtime_handlers.DPKG_STATUS, DPKG_CONTAINERD)
    write(root, CONTAINERD_MAIN, 'version = 2\nimports = ["conf.d/*.toml"]\n')
    write(root, CONTAINERD_DROP_IN, CONTAINERD_DROP_IN_V2)
    [from_etc] = runtime_handlers.runtimes(root)
    write(root, "conf.d/99-nvidia.toml", CONTAINERD_DROP_IN_V2)
    [from_root] = runtime_handlers.runtimes(root)

    assert not from_etc.nvidia_handler
    assert from_root.nvidia_handler
    assert from_root.config_files[-1] == "/conf.d/99-nvidia.toml"


def test_a_relative_import_without_a_glob_is_next_to_the_importing_file(
    root: HostRoot,
) -> None:
    write(root, runtime_handlers.DPKG_STATUS, DPKG_CONTAINERD)
    write(root, CONTAINERD_MAIN, 'version = 2\nimports = ["conf.d/99-nvidia.toml"]\n')
    write(root, CONTAINERD_DROP_IN, CONTAINERD_DROP_IN_V2)

    [state] = runtime_handlers.runtimes(root)

    assert state.nvidia_handler


def test_an_import_that_does_not_exist_stops_containerd(root: HostRoot) -> None:
    write(root, CONTAINERD_MAIN, 'version = 2\nimports = ["conf.d/99-nvidia.toml"]\n')

    [state] = runtime_handlers.runtimes(root)

    assert not state.nvidia_handler
    assert state.error == (
        "/etc/containerd/config.toml: imports /etc/containerd/conf.d/99-nvidia.toml,"
        " which does not exist"
    )


def test_imports_that_loop_are_read_once(root: HostRoot) -> None:
    write(root, CONTAINERD_MAIN, 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    write(root, "etc/containerd/conf.d/a.toml", 'imports = ["/etc/containerd/config.toml"]\n')

    [state] = runtime_handlers.runtimes(root)

    assert state.config_files == ("/etc/containerd/config.toml", "/etc/containerd/conf.d/a.toml")
    assert state.error is None


@pytest.mark.parametrize(
    ("relative", "text", "reason"),
    [
        (CONTAINERD_MAIN, "version = 2\n[plugins\n", "/etc/containerd/config.toml: "),
        (CONTAINERD_DROP_IN, "[plugins.\n", "/etc/containerd/conf.d/99-nvidia.toml: "),
        (CONTAINERD_MAIN, 'imports = "conf.d/*.toml"\n', "imports is not a list of paths"),
    ],
)
def test_a_containerd_config_that_does_not_parse_is_reported_without_the_handler(
    root: HostRoot, relative: str, text: str, reason: str
) -> None:
    containerd_with_handler(root, version=2)
    write(root, relative, text)

    [state] = runtime_handlers.runtimes(root)

    assert not state.nvidia_handler
    assert state.error is not None and reason in state.error


def test_crio_with_the_drop_in_has_the_handler(root: HostRoot) -> None:
    write(root, CRIO_MAIN_PATH, CRIO_MAIN)
    write(root, CRIO_DROP_IN_PATH, CRIO_DROP_IN)
    write(root, "etc/crio/crio.conf.d/.99-nvidia.conf.tmp123", "[half")

    assert runtime_handlers.runtimes(root) == (
        RuntimeState(
            Runtime.CRIO,
            None,
            nvidia_handler=True,
            config_files=("/etc/crio/crio.conf", "/etc/crio/crio.conf.d/99-nvidia.conf"),
            cdi_enabled=True,
        ),
    )


def test_crio_without_the_drop_in_or_with_a_broken_one(root: HostRoot) -> None:
    write(root, CRIO_MAIN_PATH, CRIO_MAIN)
    [plain] = runtime_handlers.runtimes(root)
    write(root, CRIO_DROP_IN_PATH, "[crio.runtime.runtimes.nvidia\n")
    [broken] = runtime_handlers.runtimes(root)

    assert not plain.nvidia_handler and plain.error is None
    assert not broken.nvidia_handler
    assert broken.error is not None and broken.error.startswith(f"/{CRIO_DROP_IN_PATH}: ")


def test_a_crio_drop_in_directory_that_is_a_file_is_reported(root: HostRoot) -> None:
    write(root, "etc/crio/crio.conf.d", "not a directory")

    [state] = runtime_handlers.runtimes(root)

    assert state.runtime is Runtime.CRIO
    assert state.error is not None and "is not a directory" in state.error


def test_both_runtimes_are_reported_containerd_first(root: HostRoot) -> None:
    write(root, CRIO_DROP_IN_PATH, CRIO_DROP_IN)
    write(root, CONTAINERD_MAIN, CONTAINERD_MAIN_V2)

    states = runtime_handlers.runtimes(root)

    assert [(s.runtime, s.nvidia_handler) for s in states] == [
        (Runtime.CONTAINERD, False),
        (Runtime.CRIO, True),
    ]


def test_a_dpkg_version_loses_its_epoch_and_removed_packages_do_not_count(
    root: HostRoot,
) -> None:
    status = (
        DPKG_CONTAINERD.replace("Version: 1.6", "Version: 1:1.6")
        + "\nPackage: cri-o\nStatus: deinstall ok config-files\nVersion: 1.30.0\n"
    )
    write(root, runtime_handlers.DPKG_STATUS, status)

    [state] = runtime_handlers.runtimes(root)

    assert (state.runtime, state.version) == (Runtime.CONTAINERD, "1.6.20~ds1-1+deb12u3")


def test_crio_before_1_24_has_no_cdi(root: HostRoot) -> None:
    write(
        root,
        runtime_handlers.DPKG_STATUS,
        "Package: cri-o\nStatus: install ok installed\nVersion: 1.23.5~0\n",
    )
    write(root, CRIO_DROP_IN_PATH, CRIO_DROP_IN)

    [state] = runtime_handlers.runtimes(root)

    assert (state.version, state.nvidia_handler, state.cdi_enabled) == ("1.23.5~0", True, False)


def test_a_tarball_containerd_is_versioned_from_its_go_build_information(
    root: HostRoot,
) -> None:
    ldflags = "-s -w -X github.com/containerd/containerd/v2/version.Version=v2.1.4"
    root.join("usr/local/bin").mkdir(parents=True)
    root.join("usr/local/bin/containerd").write_bytes(go_binary(f'build\t-ldflags="{ldflags}"\n'))
    containerd_with_handler(root, version=3)

    [state] = runtime_handlers.runtimes(root)

    assert state.version == "v2.1.4"
    assert state.nvidia_handler


def test_go_build_information_versions() -> None:
    tagged = "path\tgithub.com/cri-o/cri-o/cmd/crio\nmod\tgithub.com/cri-o/cri-o\tv1.31.2\th1:x=\n"
    devel = "path\tgithub.com/x/y\nmod\tgithub.com/x/y\t(devel)\t\n"

    assert gobinaries.module_info(go_binary(tagged)) == tagged
    assert gobinaries.version_in(tagged) == "v1.31.2"
    assert gobinaries.version_in(devel) is None
    assert gobinaries.module_info(b"\x7fELF" + b"\0" * 100) is None
    old_format = bytearray(go_binary(tagged))
    old_format[64 + 15] = 0  # the pointer-based header of Go before 1.18
    assert gobinaries.module_info(bytes(old_format)) is None


def test_a_changed_binary_is_read_again(tmp_path: Path) -> None:
    binary = tmp_path / "containerd"
    binary.write_bytes(go_binary("mod\tgithub.com/containerd/containerd\tv1.7.1\t\n"))
    first = gobinaries.reported_version(binary)
    binary.write_bytes(go_binary("mod\tgithub.com/containerd/containerd\tv1.7.22\t\n"))
    os.utime(binary, ns=(1, 2))

    assert (first, gobinaries.reported_version(binary)) == ("v1.7.1", "v1.7.22")
    assert gobinaries.reported_version(tmp_path / "missing") is None


def go_binary(info: str) -> bytes:
    """A file laid out as a Go 1.18+ binary's build information: an unaligned decoy of the
    magic first, then the 32-byte header on a 16-byte boundary and the inline strings."""
    header = gobinaries.MAGIC + bytes([8, gobinaries.FLAG_INLINE_STRINGS]) + bytes(16)
    version = b"go1.26.8"
    wrapped = b"\x30" * 16 + info.encode() + b"\xf9" * 16
    body = bytes([len(version)]) + version + _uvarint(len(wrapped)) + wrapped
    prefix = b"\x7fELF" + gobinaries.MAGIC + bytes(64 - 4 - len(gobinaries.MAGIC))
    return prefix + header + body + bytes(64)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
