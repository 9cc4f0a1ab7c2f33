"""The dependency locks (issue 17, finding 7): requirements/runtime.lock (what the image
installs) and requirements/dev.lock (what `make setup` installs) pin every dependency
pyproject.toml names, each within its range and with the hashes of its files; the runtime
pins are the dev lock's; and the runtime lock holds every dependency of its own packages,
since the image installs it with --no-deps."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.charts import REPO
from tests.support.locks import DEV, IMAGE, LOCKS, RUNTIME, pins


def project() -> dict[str, list[str]]:
    toml = tomllib.loads((REPO / "pyproject.toml").read_text())
    sim = tomllib.loads((REPO / "libs/gpuop-sim/pyproject.toml").read_text())
    build = [
        line.strip()
        for line in (LOCKS / "build.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return {
        "runtime": toml["project"]["dependencies"],
        "dev": toml["project"]["optional-dependencies"]["dev"],
        "simulation": [d for d in sim["project"]["dependencies"] if not d.startswith("gpuop==")],
        "build": [*toml["build-system"]["requires"], *build],
    }


def unmet(wanted: list[str], lock: dict[str, tuple[str, str, int]]) -> list[str]:
    """Each requirement the lock leaves out or pins outside its range, with why."""
    problems = []
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name not in lock:
            problems.append(f"{requirement.name} is not in the lock")
        elif not requirement.specifier.contains(lock[name][0], prereleases=True):
            problems.append(f"{requirement.name} is pinned to {lock[name][0]}, outside {text}")
    return problems


def test_the_runtime_lock_pins_every_dependency_of_the_product_within_its_range() -> None:
    assert unmet(project()["runtime"], pins(RUNTIME)) == [], "run `make lock`"


@pytest.mark.parametrize("part", ["runtime", "dev", "simulation", "build"])
def test_the_dev_lock_pins_everything_setup_installs(part: str) -> None:
    assert unmet(project()[part], pins(DEV)) == [], "run `make lock`"


def test_a_dependency_missing_from_the_lock_is_named() -> None:
    lock = pins(RUNTIME)
    assert unmet(["nats-py>=2.16,<3", "left-out>=1"], lock) == ["left-out is not in the lock"]
    assert unmet(["nats-py>=99"], lock) == [
        f"nats-py is pinned to {lock['nats-py'][0]}, outside nats-py>=99"
    ]


@pytest.mark.parametrize("lock", [RUNTIME, DEV], ids=["runtime", "dev"])
def test_every_pin_carries_the_hashes_of_its_files(lock: Path) -> None:
    found = pins(lock)
    assert found
    assert [name for name, (_, _, hashes) in found.items() if hashes == 0] == []


def test_the_image_and_the_developers_run_the_same_versions() -> None:
    dev = pins(DEV)
    runtime = pins(RUNTIME)
    assert {name: version for name, (version, _, _) in runtime.items()} == {
        name: dev[name][0] for name in runtime if name in dev
    }
    assert set(runtime) <= set(dev)


def test_the_runtime_lock_holds_every_dependency_of_its_packages() -> None:
    """The image installs the lock with --no-deps: a package's own dependency left out of
    it would be missing there. Read from the installed packages' metadata (`make setup`
    installs these versions)."""
    runtime = pins(RUNTIME)
    missing = []
    for name, (version, _, _) in runtime.items():
        installed = metadata.distribution(name)
        assert installed.version == version, f"{name} {installed.version} is installed, run make"
        for text in installed.requires or []:
            requirement = Requirement(text)
            environment = {**IMAGE, "extra": ""}
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            if canonicalize_name(requirement.name) not in runtime:
                missing.append(f"{name} needs {requirement}")
    assert missing == []
