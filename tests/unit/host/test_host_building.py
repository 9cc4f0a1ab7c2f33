"""The pure parts of building driver packages: NVIDIA's `.run` read without running it (a
small synthetic makeself archive), what a driver tree becomes in a package, apt's private
configuration, and `gpuop package build`'s flags. The build from Debian's real packages is
the slow test `tests/integration/driver_packages`."""

from __future__ import annotations

import gzip
import io
import lzma
import re
import tarfile
from pathlib import Path

import pytest

from gpuop.cli import main
from gpuop.host import building, manifests, packaging
from gpuop.host.manifests import Flavour, Role

VERSION = "535.261.03"


def payload_tar() -> bytes:
    files = {
        f"libnvidia-ml.so.{VERSION}": b"\x7fELF nvml",
        f"libcuda.so.{VERSION}": b"\x7fELF cuda",
        "nvidia-smi": b"\x7fELF smi",
        "nvidia-persistenced": b"\x7fELF pd",
        "firmware/gsp_ga10x.bin": b"gsp",
        "kernel/Makefile": b"modules:\n",
        "kernel-open/Makefile": b"modules:\n",
        "README.txt": b"NVIDIA driver",
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            info.mode = 0o755 if "." not in name else 0o644
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def makeself(payload: bytes, *, label: str = f"NVIDIA Linux-x86_64 {VERSION}") -> bytes:
    """A .run laid out as makeself writes one: a script whose `offset` line counts its own
    lines, `filesizes`, then the compressed payload."""
    script_lines = [
        "#!/bin/sh",
        "# This script was generated using Makeself 2.1.5",
        f'label="{label}"',
        'script="./nvidia-installer"',
        f'filesizes="{len(payload)}"',
        'offset=`head -n 9 "$0" | wc -c | tr -d " "`',
        'echo "this script must never run in a test" >&2',
        "exit 1",
        "eof",
    ]
    return ("\n".join(script_lines) + "\n").encode() + payload


@pytest.mark.parametrize("compress", [gzip.compress, lzma.compress, lambda data: data])
def test_a_run_installer_is_unpacked_without_running_it(tmp_path: Path, compress: object) -> None:
    assert callable(compress)
    run = tmp_path / "NVIDIA.run"
    run.write_bytes(makeself(compress(payload_tar())))
    header = building.extract_run(run, tmp_path / "out")
    assert header.label == f"NVIDIA Linux-x86_64 {VERSION}"
    assert (tmp_path / "out" / "firmware/gsp_ga10x.bin").read_bytes() == b"gsp"
    assert (tmp_path / "out" / "nvidia-smi").stat().st_mode & 0o111


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x7fELF not a script", "does not start with #!"),
        (b"#!/bin/sh\necho hi\n", "names no offset"),
        (b'#!/bin/sh\noffset=`head -n 40 "$0"`\n', "shorter than the 40 lines"),
    ],
)
def test_what_is_not_a_makeself_archive_is_refused(
    tmp_path: Path, content: bytes, words: str
) -> None:
    run = tmp_path / "x.run"
    run.write_bytes(content)
    with pytest.raises(building.BuildError, match=words):
        building.extract_run(run, tmp_path / "out")


def test_a_truncated_or_foreign_payload_is_refused(tmp_path: Path) -> None:
    whole = makeself(gzip.compress(payload_tar()))
    run = tmp_path / "cut.run"
    run.write_bytes(whole[:-100])
    with pytest.raises(building.BuildError, match="is truncated"):
        building.extract_run(run, tmp_path / "a")
    run.write_bytes(makeself(b"PK\x03\x04 a zip"))
    with pytest.raises(building.BuildError, match="neither gzip, xz, bzip2 nor a plain tar"):
        building.extract_run(run, tmp_path / "b")
    run.write_bytes(makeself(gzip.compress(b"not a tar at all" * 40)))
    with pytest.raises(building.BuildError, match="not a tar archive"):
        building.extract_run(run, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_a_run_tree_becomes_a_package_of_its_modules_user_space_and_firmware(
    tmp_path: Path,
) -> None:
    run = tmp_path / "NVIDIA.run"
    run.write_bytes(makeself(gzip.compress(payload_tar())))
    building.extract_run(run, tmp_path / "out")
    tree = building.tree_from_run(tmp_path / "out", Flavour.OPEN, run)
    assert tree.version == VERSION
    assert tree.module_source == tmp_path / "out" / "kernel-open"
    module = tmp_path / "nvidia.ko"
    module.write_bytes(b"\x7fELF")
    files, links = building.package_files(tree, [module])
    assert {path: item.role for path, item in files.items()} == {
        "modules/nvidia.ko": Role.MODULE,
        f"userspace/lib/libcuda.so.{VERSION}": Role.LIBRARY,
        f"userspace/lib/libnvidia-ml.so.{VERSION}": Role.LIBRARY,
        "userspace/bin/nvidia-smi": Role.BINARY,
        "userspace/bin/nvidia-persistenced": Role.BINARY,
        "firmware/gsp_ga10x.bin": Role.FIRMWARE,
    }
    assert files["userspace/bin/nvidia-smi"].mode == 0o755
    assert links == {
        "userspace/lib/libcuda.so.1": f"libcuda.so.{VERSION}",
        "userspace/lib/libnvidia-ml.so.1": f"libnvidia-ml.so.{VERSION}",
    }
    (built_from,) = tree.built_from
    assert (built_from.name, built_from.version) == ("NVIDIA.run", VERSION)
    built = packaging.write_package_v2(
        tmp_path / "source",
        component="gpu",
        version=tree.version,
        flavour=Flavour.OPEN,
        kernel_release="6.1.0-57-amd64",
        files=files,
        links=links,
        built_from=tree.built_from,
    )
    assert built.flavour == "open"


def test_a_run_without_the_flavours_module_tree_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(building.BuildError, match="has no kernel-open/Makefile"):
        building.tree_from_run(tmp_path / "out", Flavour.OPEN, tmp_path / "x.run")


def test_apt_gets_a_configuration_of_its_own(tmp_path: Path) -> None:
    apt = building.Apt(tmp_path / "apt")
    sources = (tmp_path / "apt" / "sources.list").read_text().splitlines()
    assert len(sources) == 3
    assert all(line.endswith("main contrib non-free non-free-firmware") for line in sources)
    assert any(" bookworm-security " in line for line in sources)
    options = " ".join(apt.options())
    assert f"Dir::Etc::sourcelist={tmp_path}/apt/sources.list" in options
    assert f"Dir::State::Lists={tmp_path}/apt/lists" in options
    assert "/etc/apt" not in options


def test_the_newest_kernel_is_the_highest_abi_number_of_the_flavour() -> None:
    lines = [
        "linux-headers-6.1.0-9-amd64 - Header files for Linux 6.1.0-9-amd64",
        "linux-headers-6.1.0-57-amd64 - Header files for Linux 6.1.0-57-amd64",
        "linux-headers-6.1.0-58-cloud-amd64 - Header files for Linux 6.1.0-58-cloud-amd64",
        "linux-headers-6.1.0-47-amd64 - Header files for Linux 6.1.0-47-amd64",
    ]
    assert building.newest_release(lines) == "6.1.0-57-amd64"
    assert building.newest_release(lines, "cloud-amd64") == "6.1.0-58-cloud-amd64"
    with pytest.raises(building.BuildError, match=re.escape("no linux-headers-6.1.0-*-rt-amd64")):
        building.newest_release(lines, "rt-amd64")


def test_the_cli_extracts_a_run_and_says_what_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "NVIDIA.run"
    run.write_bytes(makeself(lzma.compress(payload_tar())))
    code = main.main(
        ["package", "build", "--from-run", str(run), "--extract-only", "--out", str(tmp_path / "x")]
    )
    assert code == 0
    assert f"unpacked into {tmp_path / 'x'}" in capsys.readouterr().out
    assert (tmp_path / "x" / "kernel/Makefile").is_file()
    # a second time into the same directory is refused, exit 1
    assert main.main(["package", "build", "--from-run", str(run), "--extract-only",
                      "--out", str(tmp_path / "x")]) == 1  # fmt: skip
    assert "exists; extract into a new directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--from-debian", "--kernel", "6.1.0-57-amd64", "--flavour", "open"], "needs --version"),
        (["--from-debian", "--version", VERSION], "needs --kernel, --flavour"),
        (["--from-debian", "--extract-only", "--version", VERSION], "goes with --from-run"),
        (["--from-run", "/nonexistent.run", "--extract-only"], "no such file"),
        (
            [
                "--from-debian",
                "--version",
                VERSION,
                "--kernel",
                "k",
                "--flavour",
                "open",
                "--module-key",
                "/k.pem",
            ],
            "--module-key and --module-cert go together",
        ),
    ],
)
def test_the_cli_names_a_missing_or_wrong_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    code = main.main(["package", "build", *flags, "--out", str(tmp_path / "out")])
    assert code == 2
    assert words in capsys.readouterr().err


def test_a_flavour_outside_the_two_is_refused_by_the_parser(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main.main(["package", "build", "--from-debian", "--flavour", "closed", "--out", "x"])
    assert exited.value.code == 2


def test_every_module_source_package_is_a_flavour() -> None:
    assert set(building.MODULE_SOURCE_PACKAGES) == set(manifests.Flavour)


def test_module_signing_without_its_key_file_is_refused(tmp_path: Path) -> None:
    signing = building.ModuleSigning(tmp_path / "missing.pem", tmp_path / "missing.der")
    with pytest.raises(building.BuildError, match=r"missing\.pem: no such file"):
        building.sign_modules([tmp_path / "nvidia.ko"], tmp_path / "sign-file", signing)


@pytest.mark.parametrize(
    ("source", "builder", "first"),
    [
        (["--from-debian", "--version", VERSION], "build_from_debian", {"version": VERSION}),
        (["--from-run", "NVIDIA.run"], "build_from_run", {"run": Path("NVIDIA.run")}),
    ],
)
def test_the_cli_hands_its_flags_to_the_builder_of_its_source(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: list[str],
    builder: str,
    first: dict[str, object],
) -> None:
    calls: list[tuple[str, dict[str, object]]] = []

    def recorded(name: str) -> object:
        def build(*args: object, **kwargs: object) -> packaging.BuiltPackage:
            calls.append((name, {**dict(zip(["run"], args, strict=False)), **kwargs}))
            return packaging.BuiltPackage("gpu", VERSION, "k", tmp_path / "p.tar", "0" * 64)

        return build

    for name in ("build_from_debian", "build_from_run"):
        monkeypatch.setattr(building, name, recorded(name))
    flags = ["--kernel", "k", "--flavour", "open", "--jobs", "3", "--work", str(tmp_path)]
    assert main.main(["package", "build", *source, *flags, "--out", str(tmp_path / "o")]) == 0
    assert calls == [
        (
            builder,
            {
                **first,
                "kernel_release": "k",
                "flavour": Flavour.OPEN,
                "out": tmp_path / "o",
                "work": tmp_path,
                "debs": None,
                "jobs": 3,
                "signing_key": None,
                "module_signing": None,
            },
        )
    ]
    assert "UNSIGNED" in capsys.readouterr().out
