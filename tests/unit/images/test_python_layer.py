"""The image's Python packages (`tests.support.images.python`), with a wheel made here: pip
installs it into the image's dist-packages, its console script runs the image's Python and
its other scripts move as they are, and byte code is checked against source hashes, not
times, and is the same on every build."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from tests.support.images import python


def record_hash(data: bytes) -> str:
    """A RECORD line's hash: urlsafe base64 of the SHA-256, unpadded."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(directory: Path) -> Path:
    files = {
        "tool/__init__.py": b"ITEMS = {'b', 'a', 'c'}\ndef main():\n    return 0\n",
        "tool-1.0.data/scripts/tool-bin": b"\x7fELF binary",
        "tool-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tool\nVersion: 1.0\n",
        "tool-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        "tool-1.0.dist-info/entry_points.txt": b"[console_scripts]\ntool = tool:main\n",
    }
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items())
    wheel = directory / "tool-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("tool-1.0.dist-info/RECORD", record + "tool-1.0.dist-info/RECORD,,\n")
    return wheel


@pytest.mark.timeout(120)
def test_a_wheel_installs_for_the_image_s_python(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels)
    tree = tmp_path / "tree"

    python.install(["tool==1.0"], wheels, tree)

    assert (tree / python.SITE / "tool/__init__.py").is_file()
    script = (tree / python.SCRIPTS / "tool").read_text()
    assert script.startswith("#!/usr/bin/python3.11\n") and "from tool import main" in script
    assert (tree / python.SCRIPTS / "tool").stat().st_mode & 0o777 == 0o755
    assert (tree / python.SCRIPTS / "tool-bin").read_bytes() == b"\x7fELF binary"
    assert not (tree / python.SITE / "bin").exists()
    assert not list(tree.rglob("*.pyc")), "byte code is compiled separately, reproducibly"


@pytest.mark.timeout(120)
def test_a_wheel_pip_cannot_find_fails_with_pip_s_reason(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()

    with pytest.raises(python.WheelError, match=r"tool==2\.0"):
        python.install(["tool==2.0"], tmp_path / "wheels", tmp_path / "tree")


def test_byte_code_is_checked_by_source_hash_and_the_same_every_time(tmp_path: Path) -> None:
    compiled = []
    for attempt in ("one", "two"):
        package = tmp_path / attempt / "usr/lib/python3.11/tool"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("ITEMS = frozenset({'b', 'a', 'c', 'd', 'e'})\n")
        python.compile_tree(tmp_path / attempt, "usr/lib/python3.11")
        (pyc,) = package.glob("__pycache__/__init__.cpython-311.pyc")
        compiled.append(pyc.read_bytes())

    assert compiled[0] == compiled[1]
    assert int.from_bytes(compiled[0][4:8], "little") == 0b01, "hash-based, never checked"
    assert b"/usr/lib/python3.11/tool/__init__.py" in compiled[0], "named as the image's path"


def test_console_scripts_are_written_for_the_image_s_interpreter() -> None:
    assert python.script("gpuop.cli.main:main") == (
        "#!/usr/bin/python3.11\nimport sys\nfrom gpuop.cli.main import main\n"
        'if __name__ == "__main__":\n    sys.exit(main())\n'
    )
    assert "sys.exit(Tool.run())" in python.script("tool.cli:Tool.run")


def test_the_lock_is_downloaded_with_its_hashes_checked_for_the_image_s_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(python, "_pip", lambda *arguments, **_: asked.append(arguments))

    python.download(Path("requirements/runtime.lock"), tmp_path / "wheels")

    (arguments,) = asked
    assert arguments[0] == "download" and {"--require-hashes", "--no-deps"} <= set(arguments)
    assert {"--only-binary=:all:", "--python-version=3.11", "--abi=cp311"} <= set(arguments)
    assert "--platform=manylinux_2_36_x86_64" in arguments
    assert arguments[-2:] == ("-r", "requirements/runtime.lock")
