"""The files of this checkout that the repository-wide scans read (no reference outside it, no
citation of a document it lacks): every file under the named folders and the named files,
caches and the recorded node left out."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IGNORED_DIRS = frozenset(
    {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "recordings"}
)


def files(names: tuple[str, ...]) -> list[Path]:
    """Every file under the folders `names` names and every file it names, relative to the
    repository root (names that are not there are skipped)."""
    found: list[Path] = []
    for name in names:
        top = ROOT / name
        if top.is_file():
            found.append(top)
            continue
        for path in top.rglob("*"):
            if path.is_file() and not IGNORED_DIRS & set(path.relative_to(ROOT).parts):
                found.append(path)
    return found
