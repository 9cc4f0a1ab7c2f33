"""The image's Debian bookworm packages: pinned by exact version and SHA-256 in
`deploy/image/debian.lock`, fetched with `apt-get download` (apt checks each file against the
signed index of the mirror in /etc/apt), checked again against the lock, and unpacked with
`dpkg-deb -x`: never installed on this machine, and no maintainer script ever runs.

    ROOTS, IGNORED                  what the image asks for; dependencies it leaves out, and why
    read_lock(path) -> [Pin]        the pins
    resolve(roots) -> [Pin]         the candidates apt has now for `roots` and their dependencies
    download(pins, cache) -> {name: .deb}
    unmet(controls) -> [str]        dependencies no pinned package satisfies (nor IGNORED)
    unpack(debs, rootfs)            every package into one merged-/usr tree, with a dpkg status

Called by `tests.support.images.build`; `python -m tests.support.images lock` rewrites the lock.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from packageurl import PackageURL

from gpuop.host.packaging import sha256_of

ROOTS = (
    "base-files",  # /etc/os-release: what scanners read to know the image is Debian
    "python3.11-minimal",  # the interpreter
    "libpython3.11-stdlib",  # the standard library (ssl, sqlite3, decimal, ...)
    "libstdc++6",  # grpcio's, protobuf's (upb) and frozenlist's extension modules link it
    "ca-certificates",  # the chart's trust-nats-ca init container appends to its bundle
    "openssl",  # /usr/lib/ssl: OpenSSL's default CA file and directory point at that bundle
    "dash",  # /bin/sh: the chart's trust-nats-ca init container runs `sh -c`
    "coreutils",  # that command's `cat`; `chroot`, with which node agents run the host's kmod
)
"""What the image asks for. Not kmod, systemctl or iproute2: node agents run the host's own
tools (`chroot <host root> modprobe ...`), and pyroute2 speaks netlink itself."""

IGNORED = {
    "debconf": "ca-certificates' maintainer scripts ask their questions through it",
    "debconf-2.0": "the same, as a virtual package",
    "debianutils": "dash's maintainer scripts register /bin/sh in /etc/shells with it",
    "awk": "base-files' maintainer scripts",
    "dpkg": "some packages need a recent dpkg to unpack them: dpkg-deb does it here",
}
"""Dependencies left out: only maintainer scripts use them, and none runs here."""

LOCK = Path(__file__).resolve().parents[3] / "deploy" / "image" / "debian.lock"
_MERGED = ("bin", "sbin", "lib", "lib64")
_DROPPED = ("usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale")
_NAME = re.compile(r"^([a-z0-9][a-z0-9+.-]+)(?::[a-z0-9]+)?\s*(?:\(.*\))?\s*$")


class Pin(NamedTuple):
    """A line of the lock: the package, its exact version, its architecture (amd64 or all),
    its .deb's SHA-256 (hex)."""

    name: str
    version: str
    architecture: str
    sha256: str

    @property
    def purl(self) -> str:
        """Its package URL (the SBOM's name for it)."""
        qualifiers = {"arch": self.architecture}
        url = PackageURL("deb", "debian", self.name, self.version, qualifiers)
        return str(url.to_string())


class DebianError(Exception):
    """A package that cannot be fetched, fails its check, or leaves a dependency unmet."""


def read_lock(path: Path = LOCK) -> tuple[Pin, ...]:
    pins: list[Pin] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, version, architecture, sha256 = line.split()
            pins.append(Pin(name, version, architecture, sha256))
    return tuple(pins)


def write_lock(pins: Iterable[Pin], path: Path = LOCK) -> None:
    header = (
        "# The Debian bookworm packages of the gpuop image (amd64): name, version,\n"
        "# architecture, SHA-256 of the .deb. Written by `python -m tests.support.images lock`\n"
        "# from the candidates of the apt index here, for tests/support/images/debian.py's\n"
        "# ROOTS and what they depend on (less IGNORED); `make image` fetches exactly these.\n"
    )
    lines = [" ".join(pin) for pin in sorted(pins, key=lambda pin: pin.name)]
    path.write_text(header + "\n".join(lines) + "\n", encoding="utf-8")


def fields(control: str) -> dict[str, str]:
    """A control paragraph's fields (continuation lines joined)."""
    found: dict[str, str] = {}
    key = ""
    for line in control.splitlines():
        if line[:1] in (" ", "\t") and key:
            found[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            found[key] = value.strip()
    return found


def relations(value: str) -> list[list[str]]:
    """`a (>= 1) | b, c` -> [["a", "b"], ["c"]]: names only, arch qualifiers dropped."""
    groups: list[list[str]] = []
    for group in filter(None, (part.strip() for part in value.split(","))):
        names = []
        for alternative in group.split("|"):
            match = _NAME.match(alternative.strip())
            if match is None:
                raise DebianError(f"unreadable dependency {alternative.strip()!r}")
            names.append(match[1])
        groups.append(names)
    return groups


def _needs(control: Mapping[str, str]) -> list[list[str]]:
    return [
        group for key in ("Pre-Depends", "Depends") for group in relations(control.get(key, ""))
    ]


def unmet(controls: Mapping[str, str]) -> list[str]:
    """`package: dependency` for each dependency of `controls` (name -> control text) that no
    package of them provides and IGNORED does not excuse."""
    parsed = {name: fields(text) for name, text in controls.items()}
    provided = set(parsed)
    for control in parsed.values():
        provided.update(group[0] for group in relations(control.get("Provides", "")))
    return [
        f"{name}: {' | '.join(group)}"
        for name, control in sorted(parsed.items())
        for group in _needs(control)
        if not provided.intersection(group) and not IGNORED.keys() & set(group)
    ]


def _apt_show(name: str) -> dict[str, str]:
    answer = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", name],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if answer.returncode != 0 or not answer.stdout.strip():
        raise DebianError(f"apt knows no {name}: {answer.stderr.strip()} (apt-get update?)")
    return fields(answer.stdout.split("\n\n")[0])


def resolve(roots: Iterable[str] = ROOTS) -> list[Pin]:
    """The candidate versions of `roots` and of everything they depend on: of each
    dependency's alternatives, none if one is IGNORED or chosen already, else the first."""
    chosen: dict[str, dict[str, str]] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in chosen or name in IGNORED:
            continue
        chosen[name] = _apt_show(name)
        for group in _needs(chosen[name]):
            if not set(group) & (chosen.keys() | IGNORED.keys() | set(pending)):
                pending.append(group[0])
    return [Pin(name, c["Version"], c["Architecture"], c["SHA256"]) for name, c in chosen.items()]


def _cached(pin: Pin, cache: Path) -> Path | None:
    found = sorted(cache.glob(f"{pin.name}_{pin.version.replace(':', '%3a')}_*.deb"))
    return found[0] if found else None


def download(pins: Iterable[Pin], cache: Path) -> dict[str, Path]:
    """The .deb of each pin, from `cache` or fetched into it by apt, each checked against the
    lock's SHA-256 (a file that fails is removed)."""
    cache.mkdir(parents=True, exist_ok=True)
    pins = tuple(pins)
    missing = [f"{p.name}={p.version}" for p in pins if _cached(p, cache) is None]
    if missing:
        answer = subprocess.run(
            ["apt-get", "download", "--quiet", *missing],
            cwd=cache, capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
        if answer.returncode != 0:
            raise DebianError(
                f"apt-get download failed: {answer.stderr.strip()[-2000:]}\n"
                "the lock's versions must be in apt's index: apt-get update, or rewrite the "
                "lock (python -m tests.support.images lock)"
            )
    debs: dict[str, Path] = {}
    for pin in pins:
        deb = _cached(pin, cache)
        if deb is None:
            raise DebianError(f"apt-get download left no {pin.name} {pin.version}")
        if sha256_of(deb) != pin.sha256:
            deb.unlink()
            raise DebianError(f"{deb.name}: its SHA-256 is not the lock's")
        debs[pin.name] = deb
    return debs


def control(deb: Path) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def _merged(relative: Path) -> Path:
    """Where a packaged path lies in a merged-/usr tree (bookworm's layout)."""
    if relative.parts and relative.parts[0] in _MERGED:
        return Path("usr", *relative.parts)
    return relative


def _merge(source: Path, rootfs: Path, package: str) -> None:
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if any(relative.as_posix().startswith(dropped) for dropped in _DROPPED):
            continue
        target = rootfs / _merged(relative)
        if path.is_dir() and not path.is_symlink():
            target.mkdir(exist_ok=True)
            target.chmod(path.stat().st_mode & 0o7777)
        elif target.exists() or target.is_symlink():
            raise DebianError(f"{package}: /{_merged(relative)} is another package's already")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)


def unpack(debs: Mapping[str, Path], rootfs: Path) -> None:
    """Every package's files into `rootfs` (bin, sbin, lib, lib64 linked into usr), and
    var/lib/dpkg/status listing them as installed, for scanners. Every dependency must be
    among them (or IGNORED)."""
    controls = {name: control(deb) for name, deb in debs.items()}
    problems = unmet(controls)
    if problems:
        raise DebianError("dependencies no pinned package satisfies: " + "; ".join(problems))
    for directory in _MERGED:
        (rootfs / "usr" / directory).mkdir(parents=True, exist_ok=True)
        (rootfs / directory).symlink_to(f"usr/{directory}")
    status: list[str] = []
    for name in sorted(debs):
        with tempfile.TemporaryDirectory(dir=rootfs.parent) as unpacked:
            subprocess.run(
                ["dpkg-deb", "-x", str(debs[name]), unpacked],
                check=True, capture_output=True, timeout=300,
            )  # fmt: skip
            _merge(Path(unpacked), rootfs, name)
        text = controls[name].rstrip("\n")
        package, _, rest = text.partition("\n")
        status.append(f"{package}\nStatus: install ok installed\n{rest}\n")
    dpkg = rootfs / "var/lib/dpkg"
    dpkg.mkdir(parents=True, exist_ok=True)
    (dpkg / "status").write_text("\n".join(status), encoding="utf-8")


def ca_bundle(rootfs: Path) -> Path:
    """etc/ssl/certs/ca-certificates.crt, as update-ca-certificates (ca-certificates'
    maintainer script) writes it: every packaged certificate, in order."""
    certificates = sorted((rootfs / "usr/share/ca-certificates").rglob("*.crt"))
    if not certificates:
        raise DebianError("no certificates under usr/share/ca-certificates")
    bundle = rootfs / "etc/ssl/certs/ca-certificates.crt"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    with bundle.open("wb") as out:
        for certificate in certificates:
            out.write(certificate.read_bytes().rstrip(b"\n") + b"\n")
    return bundle
