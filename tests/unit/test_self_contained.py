"""A clone is enough: nothing in the project reaches outside the repository, and the skip
allow-list names only tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

from gpuop_sim import recordings
from tests import skips
from tests.support import checkout

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("libs", "tests", "deploy", "proto", ".ci", "Makefile", "pyproject.toml")
OUTSIDE = re.compile(r"\.\./shared|shared/(fixtures|reference)|/work/|\bROOT\.parent\b")
"""What code reaching past the checkout looks like: the team's shared folder beside it, this
workplace's paths, or a search above the repository root."""


def test_no_file_refers_to_a_path_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    offending = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in checkout.files(SCANNED)
        if path != this and path.suffix not in {".pyc", ".whl"}
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offending == []


def test_the_scan_would_see_a_reference_outside() -> None:
    beside = "../" + "shared"  # spelled apart, so this file does not match its own scan
    assert OUTSIDE.search(f'HOST = Path("{beside}/fixtures/h200")')
    cited = "reference/" + "cdi.md"  # apart too: the docs test refuses citations of it
    assert OUTSIDE.search(f'REFERENCE = "{beside.removeprefix("../")}/{cited}"')
    assert OUTSIDE.search("for base in (ROOT, ROOT.parent):")
    assert not OUTSIDE.search("recordings.H200_HOST_ROOT")


def test_the_recorded_h200_is_inside_the_project_and_complete() -> None:
    assert recordings.H200.is_relative_to(ROOT / "libs")
    assert "do not edit" in (recordings.H200 / "README.md").read_text()
    assert recordings.H200_NVML.is_file() and recordings.H200_NVIDIA_SMI.is_file()
    links = (recordings.H200_HOST_ROOT / "SYMLINKS.txt").read_text().splitlines()
    assert links and all(" -> " in line for line in links)
    for recorded in ("proc/driver/nvidia/version", "proc/modules", "sys/module/nvidia/version"):
        assert (recordings.H200_HOST_ROOT / recorded).is_file(), recorded
    assert (recordings.H200_HOST_ROOT / "sys/bus/pci/devices/0000:00:06.0/device").is_file()


def test_every_allowed_skip_names_a_test_that_exists_and_says_why() -> None:
    for node_id, reason in skips.ALLOWED.items():
        module, _, name = node_id.partition("::")
        assert (ROOT / module).is_file(), node_id
        assert f"def {name}(" in (ROOT / module).read_text(), node_id
        assert "kernel" in reason, f"{node_id}: a skip is only for what the kernel cannot do"


def test_no_test_module_imports_another() -> None:
    imports_a_test = re.compile(r"^\s*from (\.|tests\.\S*\.)test_\w+ import", re.M)
    offending = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if "__pycache__" not in path.parts and imports_a_test.search(path.read_text())
    ]
    assert offending == [], "shared helpers belong in tests/support"


def _foreign_helpers(text: str, own: str) -> list[str]:
    """The helper modules `text` (a module of package `own`) imports from another test
    directory than its own."""
    imported = re.findall(r"^\s*from (tests(?:\.\w+)+) import", text, re.M)
    imported += [
        f"{package}.{name}"
        for package, name in re.findall(r"^\s*from (tests(?:\.\w+)*) import (\w+)", text, re.M)
    ]
    shared = ("tests.support", "tests.skips", "tests.hostile")
    return [
        module
        for module in imported
        if not module.startswith(shared)
        and (ROOT / (module.replace(".", "/") + ".py")).is_file()
        and module.rsplit(".", 1)[0] != own
    ]


def test_helpers_shared_across_directories_live_in_tests_support() -> None:
    offending = {
        str(path.relative_to(ROOT)): _foreign_helpers(
            path.read_text(), ".".join(path.relative_to(ROOT).parent.parts)
        )
        for path in (ROOT / "tests").rglob("*.py")
        if "__pycache__" not in path.parts and "support" not in path.parts
    }
    offending = {path: helpers for path, helpers in offending.items() if helpers}
    assert offending == {}, "a helper used beyond its own directory belongs in tests/support"


def test_the_helper_scan_sees_a_foreign_helper() -> None:
    text = "from tests.unit.host.support import seeded\nfrom tests.support import waiting\n"
    assert _foreign_helpers(text, "tests.unit.cli") == ["tests.unit.host.support"]
    assert _foreign_helpers(text, "tests.unit.host") == []
