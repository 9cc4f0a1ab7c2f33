"""NVIDIA's real NVML library for the slow suites: Debian's `libnvidia-ml1` 535.261.03,
fetched with the package builder's apt (`gpuop.host.building.Apt`: Debian's non-free archive,
apt's state of its own) and unpacked with `dpkg-deb -x` under `.cache/driver-packages/`
(ignored by git). Nothing is installed on the machine: a process finds the library through
`LD_LIBRARY_PATH` (`environment`), as pynvml loads it by its soname, `libnvidia-ml.so.1`.

Run as root without a driver, the library makes `/dev/nvidiactl` (mknod, 195:255) before
it finds nothing behind it (ENXIO: `NVML_ERROR_DRIVER_NOT_LOADED`); `in_private_dev` runs a
command in a mount namespace of its own whose `/dev` is a fresh tmpfs, so the node lands
there and not in the machine's `/dev`.

Needs what `.ci/run` installs: apt with Debian's archive reachable, and dpkg-deb. A missing
tool fails the test naming what to install (`building.BuildError`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuop.host import building
from tests.support.driver_packages import CACHE, VERSION

PACKAGE = "libnvidia-ml1"
SONAME = "libnvidia-ml.so.1"
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu/nvidia/current"
"""Where Debian's package puts the library and its soname link."""


def real_nvml_library(version: str = VERSION) -> Path:
    """The directory holding Debian's `libnvidia-ml.so.1` of driver `version`, from the cache
    or fetched and unpacked into it (one fetch at a time: the cache's lock serializes test
    processes)."""
    return real_library(PACKAGE, SONAME, "nvml", version)


def real_library(package: str, soname: str, name: str, version: str = VERSION) -> Path:
    """The directory holding `soname` from Debian's `package` of driver `version`, unpacked
    under the cache as `<name>-<version>` (fetched once; the cache's lock serializes test
    processes)."""
    unpacked = CACHE / f"{name}-{version}"
    library_dir = unpacked / LIBRARY_DIR
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (library_dir / soname).exists():
            return library_dir
        debs = CACHE / "debs"
        found = sorted(debs.glob(f"{package}_{version}-*_amd64.deb"))
        if found:
            deb = found[-1]
        else:
            apt = building.Apt(CACHE / "apt")
            apt.update()
            (deb,) = apt.download([(package, apt.version_of(package, version))], debs).values()
        shutil.rmtree(unpacked, ignore_errors=True)
        building.unpack_deb(deb, unpacked)
        if not (library_dir / soname).exists():
            raise building.BuildError(f"{deb.name} has no {LIBRARY_DIR}/{soname}")
        return library_dir


def environment(library_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (the process's environment by default) with `library_dir` first on
    `LD_LIBRARY_PATH`, so a process started with it loads that `libnvidia-ml.so.1`."""
    environ = dict(os.environ if base is None else base)
    rest = environ.get("LD_LIBRARY_PATH")
    environ["LD_LIBRARY_PATH"] = f"{library_dir}:{rest}" if rest else str(library_dir)
    return environ


PRIVATE_DEV = """
mount -t tmpfs -o mode=0755,size=1m gpuop-dev /dev
for node in null:3 zero:5 full:7 random:8 urandom:9; do
    mknod -m 0666 "/dev/${node%%:*}" c 1 "${node##*:}"
done
exec "$@"
"""
"""A fresh `/dev` with the memory devices only (`unshare --mount` keeps the mount private)."""


def in_private_dev(command: Sequence[str]) -> list[str]:
    """`command` in a mount namespace of its own whose `/dev` is a fresh tmpfs (needs root
    and util-linux's `unshare`)."""
    return ["unshare", "--mount", "--", "sh", "-euc", PRIVATE_DEV, "sh", *command]
