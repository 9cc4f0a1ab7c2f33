"""The image's Python packages: the wheels of requirements/runtime.lock for Linux CPython 3.11
(manylinux, x86_64), each checked against the lock's hashes by pip, and gpuop's own wheel,
installed into a layer's tree for Debian's /usr/bin/python3.11, with byte code that depends
on the sources alone.

    download(lock, wheels)                  pip download --require-hashes into `wheels`
    install(requirements, wheels, tree)     pip install --no-deps --target the image's
                                            dist-packages; console scripts for the image's
                                            Python; other scripts (nats-server) as they are
    compile_tree(tree, relative)            *.pyc, `--invalidation-mode unchecked-hash`

Called by `tests.support.images.build`.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

INTERPRETER = "/usr/bin/python3.11"
SITE = "usr/local/lib/python3.11/dist-packages"
"""Where Debian's python3.11 looks for what is not Debian's (its sys.path)."""
SCRIPTS = "usr/local/bin"
PIP_CHECKS = ("--require-hashes", "--no-deps")
"""How the Dockerfile installs the lock too: every file hash-checked, nothing unlocked."""
_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
"""Bookworm's glibc is 2.36: every manylinux wheel up to it runs."""
_TARGET = [
    "--only-binary=:all:",
    "--implementation=cp",
    "--python-version=3.11",
    "--abi=cp311",
    *(f"--platform={platform}" for platform in _PLATFORMS),
]
_SCRIPT = """#!{interpreter}
import sys
from {module} import {attribute}
if __name__ == "__main__":
    sys.exit({call}())
"""


class WheelError(Exception):
    """pip refused: a hash that is not the lock's, a wheel missing for the image's platform."""


def _pip(*arguments: str, timeout: float = 900) -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *arguments],
        capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip
    if answer.returncode != 0:
        raise WheelError(f"pip {arguments[0]} failed: {answer.stderr.strip()[-3000:]}")


def download(lock: Path, wheels: Path) -> None:
    """Every wheel of `lock` for the image's platform into `wheels` (from PyPI, or pip's
    cache), each checked against the lock's hashes."""
    wheels.mkdir(parents=True, exist_ok=True)
    _pip("download", *PIP_CHECKS, *_TARGET, "--dest", str(wheels), "-r", str(lock))


def install(requirements: list[str], wheels: Path, tree: Path) -> None:
    """pip install `requirements` (pip's arguments: `-r lock` or `name==version`) from
    `wheels` alone into `tree`'s dist-packages, then the scripts into usr/local/bin."""
    site = tree / SITE
    _pip(
        "install", "--no-index", "--find-links", str(wheels), "--no-deps", "--no-compile",
        *_TARGET, "--target", str(site), *requirements,
    )  # fmt: skip
    _scripts(site, tree / SCRIPTS)


def console_scripts(site: Path) -> dict[str, str]:
    """name -> `module:attribute` of every console script of the distributions in `site`."""
    found: dict[str, str] = {}
    for entry_points in sorted(site.glob("*.dist-info/entry_points.txt")):
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(entry_points, encoding="utf-8")
        if parser.has_section("console_scripts"):
            found.update(parser.items("console_scripts"))
    return found


def script(reference: str) -> str:
    """A console script for the image's Python, as pip writes one (less the build's path)."""
    module, _, attribute = reference.partition(":")
    attribute = attribute.strip()
    return _SCRIPT.format(
        interpreter=INTERPRETER,
        module=module.strip(),
        attribute=attribute.split(".")[0],
        call=attribute,
    )


def _scripts(site: Path, scripts: Path) -> None:
    """pip put the scripts in `site`/bin with this machine's Python in their `#!`: console
    scripts are written again for the image's; the rest (nats-server) move as they are."""
    made = site / "bin"
    if not made.is_dir():
        return
    scripts.mkdir(parents=True, exist_ok=True)
    references = console_scripts(site)
    for path in sorted(made.iterdir()):
        target = scripts / path.name
        if path.name in references:
            target.write_text(script(references[path.name]), encoding="utf-8")
            target.chmod(0o755)
            path.unlink()
        else:
            path.rename(target)
    made.rmdir()


def compile_tree(tree: Path, relative: str) -> None:
    """Byte code for every module under `tree`/`relative`, named as the image's path, checked
    against no timestamp (the files never change in the image), the same on every build
    (a fixed hash seed orders the frozensets the same). This Python compiles them: it must be
    the image's minor release, whose byte code the image's reads."""
    if sys.version_info[:2] != (3, 11):
        raise WheelError(f"byte code for Python 3.11 needs Python 3.11, not {sys.version}")
    program = (
        "import compileall, py_compile, sys\n"
        "compileall.compile_dir(sys.argv[1], ddir=sys.argv[2], quiet=2, workers=1,\n"
        "    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
    )
    subprocess.run(
        [sys.executable, "-c", program, str(tree / relative), f"/{relative}"],
        check=True, capture_output=True, timeout=900,
        env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
