"""Real driver packages for the slow suites: NVIDIA 535.261.03 (bookworm) and 550.163.01
(trixie) built from Debian's packages (`gpuop.host.building`) for Debian bookworm's newest
kernel, security updates included (`newest_kernel`, amd64 or arm64), once per flavour, and
cached under `.cache/driver-packages/<key>/` (ignored by git).

The key is a digest of the inputs (`building.package_key`): driver version, kernel release
(which names the architecture), flavour and the recipe versions (`building.RECIPE` and the
branch's, bumped when a build would make something else of the same inputs), so a second
run finds the archive and builds nothing.
`real_source(directory, built)` copies the cached archives into a driver source signed with
the simulation's key.

Needs what `.ci/run` installs: apt with Debian's archive reachable, dpkg-deb, make, gcc-12,
binutils and kmod. A missing tool fails the test naming what to install.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuop.host import building, manifests, packaging
from gpuop.host.manifests import Flavour
from gpuop_sim.host import keys

VERSION = "535.261.03"
VERSION_550 = "550.163.01"
REPOSITORY = Path(__file__).resolve().parents[2]
CACHE = REPOSITORY / ".cache" / "driver-packages"


@dataclass(frozen=True)
class CachedPackage:
    package: packaging.BuiltPackage
    built_seconds: float | None
    """How long the build took; None when it came from the cache."""


def newest_kernel(arch: str = "amd64") -> str:
    """The kernel release to build for: the newest bookworm `6.1.0-N-<arch>`, security
    updates included, as a fleet that applies them runs (the open modules need
    `gpuop.host.compat`'s `pci_resize_resource` patch there since 6.1.0-53)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    apt = building.Apt(CACHE / ("apt" if arch == "amd64" else f"apt-{arch}"), arches=(arch,))
    with (CACHE / ".apt-lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # apt locks its lists and fails rather than wait
        apt.update()
        return building.newest_debian_kernel(apt, arch)


def cached_package(
    flavour: Flavour, kernel_release: str, *, version: str = VERSION, jobs: int = 2
) -> CachedPackage:
    """The package of driver `version` and `flavour` for `kernel_release` (amd64 or arm64,
    as it names), from the cache or built into it (one build at a time: a lock file
    serializes concurrent test processes)."""
    key = building.package_key(version, kernel_release, flavour)
    directory = CACHE / key
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = directory / "built.json"
        if record.is_file():
            fields = json.loads(record.read_text())
            path = directory / fields["file"]
            package = packaging.BuiltPackage(
                "gpu", version, kernel_release, path, fields["sha256"], flavour.value
            )
            return CachedPackage(package, None)
        if directory.exists():
            shutil.rmtree(directory)
        work = CACHE / f"work-{flavour.value}"
        start = time.monotonic()
        package = building.build_from_debian(
            version=version,
            kernel_release=kernel_release,
            flavour=flavour,
            out=directory,
            work=work,
            debs=CACHE / "debs",
            jobs=jobs,
        )
        seconds = time.monotonic() - start
        shutil.rmtree(work, ignore_errors=True)
        record.write_text(
            json.dumps({"file": package.path.name, "sha256": package.sha256, "seconds": seconds})
        )
        return CachedPackage(package, seconds)


def elf_machine(path: Path) -> str:
    """What binutils' `readelf -h` says of the ELF file's Machine (`AArch64`)."""
    header = subprocess.run(
        ["readelf", "-h", str(path)], capture_output=True, text=True, check=True
    ).stdout
    (line,) = [line for line in header.splitlines() if line.strip().startswith("Machine:")]
    return line.split(":", 1)[1].strip()


def real_source(directory: Path, built: Iterable[packaging.BuiltPackage]) -> Path:
    """A driver source in `directory` holding `built` (copied), its index signed with the
    simulation's key, which `tests.support.driver_manager.source_of` trusts."""
    directory.mkdir(parents=True, exist_ok=True)
    for package in built:
        copy = directory / package.path.name
        shutil.copyfile(package.path, copy)
        packaging.add_to_index(
            directory,
            packaging.BuiltPackage(
                package.component,
                package.version,
                package.kernel_release,
                copy,
                package.sha256,
                package.flavour,
            ),
            keys.SIGNING_KEY,
        )
    return directory


def manifest_of(package: packaging.BuiltPackage) -> manifests.ManifestV2:
    with tarfile.open(package.path) as archive:
        member = archive.extractfile(packaging.MANIFEST)
        assert member is not None
        manifest = manifests.parse(member.read())
    assert isinstance(manifest, manifests.ManifestV2)
    return manifest


def module_signing(directory: Path) -> tuple[building.ModuleSigning, Path]:
    """A throwaway module signing key and certificate in `directory`, and the kernel's
    `sign-file` from the cached `linux-kbuild-*` package (unpacked there)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuop test module signing")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2040, 1, 1, tzinfo=datetime.UTC))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    key_file, certificate_file = directory / "module.pem", directory / "module.der"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    certificate_file.write_bytes(certificate.public_bytes(serialization.Encoding.DER))
    (kbuild,) = sorted((CACHE / "debs").glob("linux-kbuild-*.deb"))[-1:]
    building.unpack_deb(kbuild, directory / "kbuild")
    (sign_file,) = (directory / "kbuild").glob("usr/lib/linux-kbuild-*/scripts/sign-file")
    return building.ModuleSigning(key_file, certificate_file), sign_file
