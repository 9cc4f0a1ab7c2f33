"""The product's wheel, built as the Dockerfile builds it (`pip wheel --no-deps` over the files
its build stage copies), holds the package `gpuop` and its metadata and nothing beside them:
the simulation (libs/gpuop-sim) is a distribution of its own, and a package pattern that also
matches its folder would ship it in the image (issue 34).

The sources are copied as a fresh clone has them, without .dockerignore's filter, so the
wheel's contents rest on pyproject.toml alone."""

from __future__ import annotations

import re
import shutil
import zipfile

import dockerfile
import pytest

from tests.support.charts import REPO
from tests.support.wheels import build_wheel

# what a developer's tree holds and a fresh clone does not
_BUILD_LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")


def copied_by_the_build_stage() -> list[str]:
    """The sources the Dockerfile's first stage copies into its context, in order."""
    commands = dockerfile.parse_file(str(REPO / "Dockerfile"))
    stage_starts = [i for i, command in enumerate(commands) if command.cmd == "FROM"]
    build_stage = commands[stage_starts[0] : stage_starts[1]]
    return [
        source
        for command in build_stage
        if command.cmd == "COPY" and not command.flags
        for source in command.value[:-1]
    ]


def strays(names: list[str]) -> list[str]:
    """The wheel's top-level entries other than `gpuop/` and gpuop's own dist-info."""
    tops = sorted({name.split("/", 1)[0] for name in names})
    return [
        top for top in tops if top != "gpuop" and not re.fullmatch(r"gpuop-[^/]+\.dist-info", top)
    ]


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    context = tmp_path_factory.mktemp("context")
    for source in copied_by_the_build_stage():
        target = context / source
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, target, symlinks=True, ignore=_BUILD_LEFTOVERS)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / source, target)
    wheel = build_wheel(context, tmp_path_factory.mktemp("wheels"))
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


@pytest.mark.timeout(120)
def test_the_product_wheel_holds_gpuop_and_its_metadata_only(product_wheel: list[str]) -> None:
    assert "gpuop/__init__.py" in product_wheel
    assert "gpuop/services/driver_manager/__init__.py" in product_wheel
    assert strays(product_wheel) == [], "the product's wheel (the image's) holds gpuop only"


def test_any_other_top_level_entry_is_a_stray() -> None:
    names = [
        "gpuop/__init__.py",
        "gpuop-0.1.0.dist-info/METADATA",
        "gpuop-sim/gpuop_sim/__init__.py",
        "gpuop_sim/__init__.py",
        "gpuop-0.1.0.data/scripts/x",
        "tests/conftest.py",
    ]
    assert strays(names) == ["gpuop-0.1.0.data", "gpuop-sim", "gpuop_sim", "tests"]
