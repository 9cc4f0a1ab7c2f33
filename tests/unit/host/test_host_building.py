"""The pure parts of building driver packages: NVIDIA's `.run` read without running it (a
small synthetic makeself archive), what a driver tree becomes in a package, apt's private
configuration, and `gpuop package build`'s flags. The build from Debian's real packages is
the slow test `tests/integration/driver_packages`."""

from __future__ import annotations

import gzip
import io
import lzma
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpuop.cli import main
from gpuop.host import branches, building, manifests, packaging
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


def test_every_branch_has_a_module_source_package_of_each_flavour() -> None:
    for branch in branches.BRANCHES.values():
        assert {f for f, _, _ in branch.module_sources} == set(manifests.Flavour)
        assert branch.module_source(Flavour.OPEN)[0] == "nvidia-open-kernel-dkms"


def test_a_version_of_a_branch_without_a_recipe_is_refused_naming_those_there_are() -> None:
    assert branches.branch_of("550.163.01").suites[0][1] == "trixie"
    assert branches.branch_of("535.309.01").suites == ()
    with pytest.raises(branches.UnknownTarget, match=r"branch 470 \(470.256.02\).*535, 550"):
        branches.branch_of("470.256.02")
    with pytest.raises(building.BuildError, match="no recipe for driver branch 470"):
        building.package_key("470.256.02", "6.1.0-57-amd64", Flavour.OPEN)


def test_the_550_branch_reads_trixie_beside_bookworms_kernels(tmp_path: Path) -> None:
    suites = (*branches.KERNEL_SUITES, *branches.BRANCHES["550"].suites)
    apt = building.Apt(tmp_path / "apt", suites, ("arm64",))
    sources = (tmp_path / "apt" / "sources.list").read_text().splitlines()
    assert sources[-1].endswith("debian trixie contrib non-free non-free-firmware")
    assert sum(" bookworm" in line for line in sources) == 3
    options = apt.options()
    assert "APT::Architectures::=arm64" in options and "APT::Architecture=amd64" in options


def test_each_branch_and_architecture_has_its_own_cache_key() -> None:
    keys = {
        building.package_key(version, kernel, flavour)
        for version in ("535.261.03", "550.163.01")
        for kernel in ("6.1.0-57-amd64", "6.1.0-57-arm64")
        for flavour in Flavour
    }
    assert len(keys) == 8
    # 535's key is the one it had before branches had recipes: caches stay warm
    assert building.package_key("535.261.03", "6.1.0-57-amd64", Flavour.OPEN) == (
        building.cache_key("535.261.03", "6.1.0-57-amd64", "open", building.RECIPE)
    )


# Debian's own fields: trixie's 550.163.01-2 and bookworm's 535.261.03-1 (amd64)
TRIXIE_NVIDIA_SMI = (
    "nvidia-alternative (= 550.163.01-2), libnvidia-ml1 (= 550.163.01-2), libc6 (>= 2.34)"
)
TRIXIE_LIBCUDA = (
    "nvidia-support, nvidia-alternative (= 550.163.01-2), libnvidia-ptxjitcompiler1 "
    "(= 550.163.01-2), libnvidia-pkcs11-openssl3 (= 550.163.01-2), libc6 (>= 2.34)"
)


def test_user_space_within_the_hosts_glibc_is_accepted() -> None:
    depends = {"nvidia-smi": TRIXIE_NVIDIA_SMI, "libcuda1": TRIXIE_LIBCUDA, "x": "libc6-dev"}
    building.check_glibc("550.163.01", depends, branches.HOST_GLIBC)
    building.check_glibc("550.163.01", depends, "2.34")


def test_user_space_needing_a_newer_glibc_is_refused_with_which_package_and_why() -> None:
    depends = {"nvidia-smi": TRIXIE_NVIDIA_SMI, "libcuda1": TRIXIE_LIBCUDA}
    with pytest.raises(building.BuildError) as refused:
        building.check_glibc("550.163.01", depends, "2.31")
    said = str(refused.value)
    assert said.startswith("driver 550.163.01's user space needs glibc 2.34 and the hosts run 2.31")
    assert "libcuda1 Depends libc6 (>= 2.34), nvidia-smi Depends libc6 (>= 2.34)" in said
    assert "--host-glibc" in said
    assert branches.version_tuple("2.36-9+deb12u13") > branches.version_tuple("2.4")


class DebianArchive:
    """`building.Apt`'s reading side over `.deb`s made here with dpkg-deb: every package at
    trixie's 550.163.01-2, with the `Depends` given."""

    def __init__(self, directory: Path, depends: dict[str, str]) -> None:
        self.directory, self.depends, self.asked = directory, depends, []

    def version_of(self, package: str, upstream: str | None, arch: str = "amd64") -> str:
        return "550.163.01-2"

    def download(
        self, wanted: list[tuple[str, str]], into: Path, arch: str = "amd64"
    ) -> dict[str, Path]:
        made = {}
        for name, version in wanted:
            self.asked.append((name, arch))
            tree = self.directory / "trees" / name
            (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
            (tree / "DEBIAN/control").write_text(
                f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
                f"Maintainer: t <t@example.com>\nDescription: t\n"
                f"Depends: {self.depends.get(name, 'nvidia-support')}\n"
            )
            made[name] = into / f"{name}_{version}_{arch}.deb"
            into.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-b", str(tree), str(made[name])], check=True,
                           capture_output=True)  # fmt: skip
        return made


def test_a_branch_whose_user_space_needs_a_newer_glibc_is_refused_before_unpacking(
    tmp_path: Path,
) -> None:
    archive = DebianArchive(tmp_path, {"nvidia-smi": TRIXIE_NVIDIA_SMI})
    root = tmp_path / "root"
    apt: building.Apt = archive  # type: ignore[assignment]
    with pytest.raises(
        building.BuildError, match=re.escape("needs glibc 2.34 and the hosts run 2.31")
    ):
        building.tree_from_debian(
            apt, "550.163.01", Flavour.OPEN, tmp_path / "debs", root, host_glibc="2.31"
        )
    assert not root.exists()
    assert ("nvidia-open-kernel-dkms", "amd64") in archive.asked
    # within the hosts' glibc it goes on to unpack (these packages hold no module sources)
    with pytest.raises(
        building.BuildError, match=re.escape("has no nvidia-current-open-550.163.01")
    ):
        building.tree_from_debian(
            apt, "550.163.01", Flavour.OPEN, tmp_path / "debs2", tmp_path / "root2"
        )


def test_the_architecture_is_the_kernels_unless_given_and_never_another() -> None:
    assert building.arch_of("6.1.0-57-arm64", None).name == "arm64"
    assert building.arch_of("6.1.0-57-amd64", None).name == "amd64"
    assert building.arch_of("6.18.44-fc-v657-gpu", None).name == "amd64"
    assert building.arch_of("6.18.44-custom", "arm64").multiarch == "aarch64-linux-gnu"
    with pytest.raises(
        building.BuildError, match=re.escape("6.1.0-57-amd64 is an amd64 kernel, not arm64")
    ):
        building.arch_of("6.1.0-57-amd64", "arm64")
    with pytest.raises(building.BuildError, match="no architecture riscv64"):
        building.arch_of("6.1.0-57-riscv64", "riscv64")


def test_arm64_modules_are_compiled_with_debians_cross_compiler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert building.cross_flags(branches.ARCHES["amd64"]) == []
    monkeypatch.setattr(building.shutil, "which", lambda name, **_: f"/usr/bin/{name}")
    flags = building.cross_flags(branches.ARCHES["arm64"])
    assert {"ARCH=arm64", "CROSS_COMPILE=aarch64-linux-gnu-", "CC=aarch64-linux-gnu-gcc-12"} <= set(
        flags
    )
    monkeypatch.setattr(building.shutil, "which", lambda name, **_: None)
    with pytest.raises(building.BuildError, match="apt-get install gcc-12-aarch64-linux-gnu"):
        building.cross_flags(branches.ARCHES["arm64"])


def test_a_cached_deb_of_another_architecture_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    debs = tmp_path / "debs"
    debs.mkdir()
    (debs / "libcuda1_535.261.03-1_amd64.deb").write_bytes(b"amd64")
    (debs / "linux-headers-6.1.0-57-common_6.1.192-3_all.deb").write_bytes(b"all")
    asked: list[list[str]] = []

    def apt_get(command: list[str], **_: object) -> str:
        asked.append(command[command.index("download") + 1 :])
        (debs / "libcuda1_535.261.03-1_arm64.deb").write_bytes(b"arm64")
        return ""

    monkeypatch.setattr(building, "_run", apt_get)
    apt = building.Apt(tmp_path / "apt", arches=("arm64",))
    got = apt.download([("libcuda1", "535.261.03-1")], debs, "arm64")
    assert asked == [["libcuda1:arm64=535.261.03-1"]]
    assert got["libcuda1"].read_bytes() == b"arm64"
    common = apt.download([("linux-headers-6.1.0-57-common", "6.1.192-3")], debs, "arm64")
    assert common["linux-headers-6.1.0-57-common"].read_bytes() == b"all"
    assert len(asked) == 1


def test_module_signing_without_its_key_file_is_refused(tmp_path: Path) -> None:
    signing = building.ModuleSigning(tmp_path / "missing.pem", tmp_path / "missing.der")
    with pytest.raises(building.BuildError, match=r"missing\.pem: no such file"):
        building.sign_modules([tmp_path / "nvidia.ko"], tmp_path / "sign-file", signing)


@pytest.mark.parametrize(
    ("source", "builder", "first"),
    [
        (
            ["--from-debian", "--version", VERSION, "--host-glibc", "2.31"],
            "build_from_debian",
            {"version": VERSION, "host_glibc": "2.31"},
        ),
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
    flags += ["--arch", "arm64"]
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
                "arch": "arm64",
            },
        )
    ]
    assert "UNSIGNED" in capsys.readouterr().out
