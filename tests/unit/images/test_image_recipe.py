"""`make image` and the Dockerfile install the same thing: the Dockerfile is parsed (BuildKit's
parser) and each of its choices is compared with the builder's (`tests.support.images`): the
wheel's sources and `pip wheel --no-deps`, the lock file and pip's hash checks, no extras, the
user and its ids, the entrypoint, command and environment, and the base image's CA bundle."""

from __future__ import annotations

import shlex
from fnmatch import fnmatch

import dockerfile

from tests.support.charts import REPO, image_user
from tests.support.images import build, debian, python


def stages() -> list[list[dockerfile.Command]]:
    found: list[list[dockerfile.Command]] = []
    for instruction in dockerfile.parse_file(str(REPO / "Dockerfile")):
        if instruction.cmd == "FROM":
            found.append([])
        found[-1].append(instruction)
    return found


def commands(stage: list[dockerfile.Command]) -> list[list[str]]:
    """Each RUN's commands (split at &&) as words."""
    return [
        shlex.split(step)
        for instruction in stage
        if instruction.cmd == "RUN"
        for step in instruction.value[0].split("&&")
    ]


def pip(stage: list[dockerfile.Command], verb: str) -> list[list[str]]:
    return [words[2:] for words in commands(stage) if words[:2] == ["pip", verb]]


def test_the_wheel_is_built_from_the_same_sources_with_no_dependencies() -> None:
    wheel_stage, _ = stages()
    copied = [
        source
        for instruction in wheel_stage
        if instruction.cmd == "COPY" and not instruction.flags
        for source in instruction.value[:-1]
        if source != "requirements/runtime.lock"
    ]
    (wheel,) = pip(wheel_stage, "wheel")

    assert tuple(copied) == build.SOURCES
    ignored = [
        line.strip().rstrip("/").rpartition("/")[2]
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and line[0] not in "#!" and line.strip() != "*"
    ]
    assert ignored and all(any(fnmatch(name, left) for left in build.LEFT_OUT) for name in ignored)
    assert "--no-deps" in wheel and wheel[-1] == ".", "the project itself, with no extras"


def test_both_install_the_runtime_lock_with_its_hashes_and_nothing_else() -> None:
    _, final = stages()
    lock_install, wheel_install = pip(final, "install")

    assert build.RUNTIME_LOCK == REPO / "requirements/runtime.lock"
    assert lock_install[lock_install.index("-r") + 1] == "/wheels/runtime.lock"
    flags = {word for word in lock_install if word.startswith("--")} - {"--no-cache-dir"}
    assert flags == set(python.PIP_CHECKS) == {"--require-hashes", "--no-deps"}
    assert "--no-deps" in wheel_install and wheel_install[-1] == "/wheels/*.whl"
    assert not any("[" in word for words in (lock_install, wheel_install) for word in words)


def test_both_run_gpuop_as_the_same_unprivileged_user() -> None:
    _, final = stages()
    (user,) = [i.value[0] for i in final if i.cmd == "USER"]
    (entrypoint,) = [i for i in final if i.cmd == "ENTRYPOINT"]
    (cmd,) = [i for i in final if i.cmd == "CMD"]
    useradd = next(words for words in commands(final) if words[0] == "useradd")

    assert user == build.USER
    assert int(user.partition(":")[0]) == image_user()
    assert useradd[useradd.index("--uid") + 1] == build.USER.partition(":")[0]
    assert (entrypoint.json, entrypoint.value) == (True, build.ENTRYPOINT)
    assert cmd.value == build.CMD


def test_the_dockerfile_s_environment_is_the_image_s() -> None:
    _, final = stages()
    set_there = {
        f"{name}={value}"
        for instruction in final
        if instruction.cmd == "ENV"
        for name, value in zip(instruction.value[::2], instruction.value[1::2], strict=True)
    }

    assert set_there and set_there <= set(build.ENV)


def test_both_carry_the_ca_bundle_the_chart_s_init_container_reads() -> None:
    _, final = stages()
    tests = [words for words in commands(final) if words[0] == "test"]

    assert ["test", "-s", "/etc/ssl/certs/ca-certificates.crt"] in tests
    assert "ca-certificates" in debian.ROOTS
    assert {"dash", "coreutils"} <= set(debian.ROOTS), "its `sh -c 'cat ...'`"
