"""The image, checked without a container engine: the Dockerfile parses with BuildKit's own
parser (the `dockerfile` wheel), runs `gpuop` as an unprivileged user, and its build context
(what .dockerignore lets through) is enough to build the gpuop wheel with every service."""

from __future__ import annotations

import re
import shutil
import tomllib
import zipfile
from pathlib import Path

import dockerfile
import pytest

from gpuop_sim import recordings
from tests.support.charts import REPO
from tests.support.wheels import build_wheel

BASE = "python:3.11-slim"


def instructions() -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(REPO / "Dockerfile"))


def stages() -> list[list[dockerfile.Command]]:
    found: list[list[dockerfile.Command]] = []
    for instruction in instructions():
        if instruction.cmd == "FROM":
            found.append([])
        found[-1].append(instruction)
    return found


def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _glob(pattern: str, path: str) -> bool:
    wildcards = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern)
    regex = "".join(wildcards.get(part, re.escape(part)) for part in parts)
    return re.fullmatch(regex, path) is not None


def in_context(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path, or a directory above it, wins;
    `!` puts back what an earlier pattern left out."""
    parts = path.split("/")
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern.removeprefix("!").strip("/")
        if any(_glob(bare, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            included = negated
    return included


def test_it_parses_and_every_stage_starts_from_python_311_slim() -> None:
    commands = {instruction.cmd for instruction in instructions()}

    assert commands <= {"FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "ENTRYPOINT", "CMD"}
    assert [stage[0].value[0] for stage in stages()] == [BASE, BASE]


def test_the_image_runs_gpuop_as_an_unprivileged_user() -> None:
    final = stages()[-1]
    (user,) = [i for i in final if i.cmd == "USER"]
    (entrypoint,) = [i for i in final if i.cmd == "ENTRYPOINT"]
    created = " ".join(i.value[0] for i in final if i.cmd == "RUN")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]

    uid, _, gid = user.value[0].partition(":")
    assert int(uid) >= 1000 and int(gid) >= 1000
    assert f"--uid {uid}" in created and f"--gid {gid}" in created
    assert user is final[-3], "USER must come after everything that needs root"
    assert entrypoint.json and entrypoint.value == ("gpuop",)
    assert "gpuop" in scripts


def test_the_image_installs_the_locked_dependencies_then_the_built_wheel() -> None:
    build, final = stages()
    (wheel,) = [i.value[0] for i in build if i.cmd == "RUN"]
    (copied,) = [i for i in final if i.cmd == "COPY"]

    assert wheel.startswith("pip wheel") and "--no-deps --wheel-dir /wheels" in wheel
    assert "cp requirements/runtime.lock /wheels/" in wheel
    assert copied.flags == ("--from=build",) and copied.value == ("/wheels", "/wheels")
    (install,) = [i.value[0] for i in final if i.cmd == "RUN"]
    steps = [step.strip() for step in install.split("&&")]
    # every dependency from the lock, each file checked against its hash; the wheel adds none
    assert (
        steps[0] == "pip install --no-cache-dir --require-hashes --no-deps -r /wheels/runtime.lock"
    )
    assert steps[1] == "pip install --no-cache-dir --no-deps /wheels/*.whl"
    # the chart's trust-nats-ca init container reads the base image's CA bundle
    assert "test -s /etc/ssl/certs/ca-certificates.crt" in install


def test_every_copied_source_is_in_the_build_context() -> None:
    patterns = ignore_patterns()
    sources = [
        source
        for instruction in instructions()
        if instruction.cmd == "COPY" and not instruction.flags
        for source in instruction.value[:-1]
    ]

    assert sources == [
        "pyproject.toml",
        "README.md",
        "requirements/runtime.lock",
        "libs",
    ]
    for source in sources:
        assert (REPO / source).exists(), source
        assert in_context(source, patterns), f".dockerignore leaves out {source}"


def test_the_context_leaves_out_what_the_image_does_not_need() -> None:
    patterns = ignore_patterns()

    for path in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "deploy/nats/accounts.conf",
                 "libs/gpuop/__pycache__/x.pyc", "libs/gpuop.egg-info/PKG-INFO"):  # fmt: skip
        assert not in_context(path, patterns), path
    assert in_context("libs/gpuop/bus/jetstream.py", patterns)
    assert in_context("libs/gpuop/services/telemetry/catalog.py", patterns)


@pytest.mark.timeout(120)
def test_the_build_context_builds_a_wheel_with_every_service(tmp_path: Path) -> None:
    patterns = ignore_patterns()
    context = tmp_path / "context"
    for source in ("pyproject.toml", "README.md", "libs"):
        target = context / source
        if (REPO / source).is_dir():
            shutil.copytree(
                REPO / source,
                target,
                symlinks=True,
                ignore=lambda directory, names: [
                    n
                    for n in names
                    if not in_context(str((Path(directory) / n).relative_to(REPO)), patterns)
                ],
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / source, target)

    wheel = build_wheel(context, tmp_path / "wheels")
    assert wheel.name.startswith("gpuop-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read("gpuop-0.1.0.dist-info/entry_points.txt").decode()
    for service in ("discovery", "driver_manager", "device_plugin", "network_manager",
                    "telemetry", "upgrade_orchestrator"):  # fmt: skip
        assert f"gpuop/services/{service}/__init__.py" in names, service
        assert f"gpuop.services.{service}:SERVICE" in entry_points
    assert "gpuop = gpuop.cli.main:main" in entry_points
    simulation = [
        name
        for name in names
        if re.search(
            r"gpuop_sim|gpuop/sim/|simkernel|simstate|seeding|standins|/sim_|simulated", name
        )
    ]
    assert simulation == [], "the product's wheel (the image's) holds no simulation"


@pytest.mark.timeout(120)
def test_the_simulation_s_wheel_holds_the_whole_recording_and_its_plugins(tmp_path: Path) -> None:
    source = tmp_path / "gpuop-sim"  # a copy: building leaves build/ and egg-info beside it
    shutil.copytree(
        REPO / "libs/gpuop-sim", source, ignore=shutil.ignore_patterns("__pycache__", "build")
    )
    wheel = build_wheel(source, tmp_path / "wheels")
    assert wheel.name.startswith("gpuop_sim-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read("gpuop_sim-0.1.0.dist-info/entry_points.txt").decode()
    recorded = {
        f"gpuop_sim/recordings/h200/{path.relative_to(recordings.H200).as_posix()}"
        for path in recordings.H200.rglob("*")
        if path.is_file()
    }
    assert recorded and recorded <= names, sorted(recorded - names)[:5]
    assert not any(name.startswith("gpuop/") for name in names)
    for group in ("gpuop.commands", "gpuop.nvml", "gpuop.kernels"):
        assert f"[{group}]" in entry_points, group
