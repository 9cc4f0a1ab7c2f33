"""The `driver` section of the cluster policy: which driver versions the nodes should run.

A change of `driver.gpu.version` or `driver.ofed.version` is what starts a rollout (DESIGN.md
section 4); the orchestrator puts the version and source into the driver-manager commands
(`gpuop.events.driver.InstallDriver`), so the version syntax here is the one those commands
accept, and the source is one that driver-manager can read (`services/driver_manager/
sources.py`): an absolute directory, a `file://` URL, or an http(s) URL holding `index.json`.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from gpuop.policy.fields import Section

VERSION_PATTERN = r"^[0-9A-Za-z][0-9A-Za-z.+_~-]*$"
"""The driver version syntax, the same as `gpuop.events.fields.Version`."""
VERSION_MAX_LENGTH = 64
SOURCE_MAX_LENGTH = 2048
SOURCE_PATTERN = r"^(/|file:///|https?://[^/?#\s]+)"
"""A loose shape check for the CRD schema; `_check_source` is the full check."""

_VERSION = re.compile(VERSION_PATTERN)


def _check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise PydanticCustomError(
            "driver_version",
            'must be a version such as "580.105.08": letters, digits and ". + _ ~ -", '
            "starting with a letter or digit",
        )
    return version


def _check_source(source: str) -> str:
    if not _is_source(source):
        raise PydanticCustomError(
            "driver_source",
            "must be an absolute directory path, a file:// URL or an http(s) URL",
        )
    return source


def _is_source(source: str) -> bool:
    if any(char.isspace() for char in source):
        return False
    if source.startswith("/"):
        return True
    parts = urlsplit(source)
    if parts.scheme == "file":
        return parts.netloc == "" and parts.path.startswith("/")
    return parts.scheme in ("http", "https") and bool(parts.hostname)


DriverVersion = Annotated[
    str,
    Field(
        min_length=1,
        max_length=VERSION_MAX_LENGTH,
        json_schema_extra={"pattern": VERSION_PATTERN},
    ),
    AfterValidator(_check_version),
]
"""A driver version: `580.105.08`, `24.10-1.1.4.0`."""

DriverSource = Annotated[
    str,
    Field(
        min_length=1,
        max_length=SOURCE_MAX_LENGTH,
        json_schema_extra={"pattern": SOURCE_PATTERN},
    ),
    AfterValidator(_check_source),
]
"""Where driver packages come from: an absolute directory, `file://` or http(s) URL."""


class ComponentSpec(Section):
    """The desired driver of one component (the GPU driver or the OFED driver)."""

    version: DriverVersion
    """The version every managed node should run: `580.105.08` for the GPU driver,
    `24.10-1.1.4.0` for OFED. Changing it starts a rolling upgrade (unless
    `upgradePolicy.autoUpgrade` is false)."""
    source: DriverSource | None = None
    """Where driver-manager fetches the packages: a directory holding `index.json` (an
    absolute path as the agent sees it, or a `file://` URL) or an http(s) URL. Unset: the
    source driver-manager was configured with."""


class DriverSpec(Section):
    """The drivers gpuop manages on the nodes."""

    gpu: ComponentSpec
    """The NVIDIA GPU kernel driver."""
    ofed: ComponentSpec | None = None
    """The OFED (MLNX/DOCA) network driver; unset: gpuop leaves the OFED driver alone. A
    change of both versions is applied to a node in one maintenance window."""
