"""One settings object for every service: flags, `GPUOP_*` environment variables, defaults.

`gpuop run <service>` (a DaemonSet pod, a test, a person at a terminal) builds `Settings`
here and nowhere else; each flag `--nats-creds` also reads `GPUOP_NATS_CREDS`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuop.bus import streams
from gpuop.events import subjects

ENV_PREFIX = "GPUOP_"
DEFAULT_HOST_ROOT = Path("/host")
"""Where a node agent's pod mounts the node's root filesystem."""


class Role(enum.StrEnum):
    """Where a service instance runs."""

    NODE = "node"
    """A DaemonSet pod on one node: NATS credentials only, no Kubernetes write access."""
    CLUSTER = "cluster"
    """A Deployment: the Kubernetes RBAC its job needs and nothing more."""


class SettingsError(ValueError):
    """Settings that cannot work; the message names the flag and what is wrong."""


_NVML = re.compile(r"^(real|sim:([1-9]|[1-5][0-9]|6[0-4])|recorded:.+)$")
_LISTEN = re.compile(r"^(?P<host>[^:\s]+|\[[0-9a-fA-F:]+\]):(?P<port>[0-9]{1,5})$")


class Settings(BaseModel):
    """Everything a service is told at start."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    service: str
    """Which service runs (`discovery`, `driver-manager`, ...)."""
    role: Role = Role.NODE
    """Node agent or cluster controller."""
    node: str | None = None
    """This node's Kubernetes name (required for the node role)."""
    nats: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    """NATS server URLs."""
    nats_creds: Path | None = None
    """NATS credentials file (production NATS uses per-service users)."""
    nats_token_file: Path | None = None
    """A file holding the token to connect with, read at every (re)connect: in callout mode
    (deploy/nats/callout.conf) the pod's projected service-account token for gpuop-nats."""
    nats_id_key_file: Path | None = None
    """The key of this publisher's message ids when its credential is not a secret of its own
    (a token): read, or made with a random key when missing (deploy/nats/README.md)."""
    nats_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas of every stream and KV bucket: 1 for one server, 3 on a JetStream cluster
    (a saga, an inventory and the audit log then survive losing a server)."""
    nats_placement: tuple[str, ...] = ()
    """Server tags the servers holding gpuop's streams and buckets must have (JetStream
    placement, such as `az:east`); empty: any server of the cluster."""
    nats_store_bytes: int = Field(default=streams.DEFAULT_STORE_BYTES, ge=streams.MiB)
    """Bytes of the NATS account's file store gpuop's streams and buckets reserve together
    (each its share, divided by its replicas); every service must be given the same, or
    the orchestrator's start sets its own and the others report the difference."""
    nats_wait: float = Field(default=30.0, ge=0, le=3600)
    """Seconds to keep trying NATS at start before giving up with exit code 1."""
    prefix: str = subjects.DEFAULT_PREFIX
    """Subject prefix, so several clusters can share one NATS."""
    kubeconfig: Path | None = None
    """Kubeconfig for cluster roles; in a pod the service account is used when unset."""
    host_root: Path = DEFAULT_HOST_ROOT
    """Where the node's root filesystem is mounted."""
    nvml: str = "real"
    """NVML backend: `real`, `sim:<gpus>` or `recorded:<file>`."""
    metrics_listen: str = "127.0.0.1:0"
    """HOST:PORT for /healthz, /readyz and /metrics (port 0 picks a free one)."""
    metrics_web_config: Path | None = None
    """A Prometheus web-config file: TLS for those endpoints, basic auth for /metrics."""
    config: Path | None = None
    """Optional service configuration file."""
    log_level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    """Log level."""
    log_format: str = Field(default="json", pattern="^(json|text)$")
    """`json` for machines, `text` for people."""

    @field_validator("node")
    @classmethod
    def _node_name(cls, node: str | None) -> str | None:
        return None if node is None else subjects.validate_node_name(node)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, prefix: str) -> str:
        return subjects.validate_prefix(prefix)

    @field_validator("nvml")
    @classmethod
    def _nvml(cls, nvml: str) -> str:
        if not _NVML.match(nvml):
            raise ValueError("expected real, sim:<gpus> (1-64) or recorded:<file>")
        return nvml

    @field_validator("metrics_listen")
    @classmethod
    def _listen(cls, listen: str) -> str:
        match = _LISTEN.match(listen)
        if not match or int(match["port"]) > 65535:
            raise ValueError("expected HOST:PORT")
        return listen

    @property
    def listen_address(self) -> tuple[str, int]:
        host, _, port = self.metrics_listen.rpartition(":")
        return host.strip("[]"), int(port)

    def require_node(self) -> str:
        """`node`, which a node role cannot run without; raises `SettingsError` when unset."""
        if self.node is None:
            raise SettingsError("--node is required for the node role")
        return self.node

    def require_host_root(self) -> Path:
        """`host_root`, which a node role reads and never creates; raises `SettingsError`
        when it is not a directory."""
        if not self.host_root.is_dir():
            hint = (
                " (the default, where a pod mounts the node's /; off a node pass --host-root"
                " DIR or set GPUOP_HOST_ROOT, for example a root made by `gpuop sim host`)"
                if self.host_root == DEFAULT_HOST_ROOT
                else ""
            )
            raise SettingsError(f"--host-root {self.host_root}: no such directory{hint}")
        return self.host_root


def load(flags: Mapping[str, Any], environ: Mapping[str, str]) -> Settings:
    """Flags win over `GPUOP_*` variables, which win over defaults."""
    values: dict[str, Any] = {}
    for name in Settings.model_fields:
        env = environ.get(ENV_PREFIX + name.upper())
        if env is not None and env != "":
            values[name] = env
        if flags.get(name) is not None:
            values[name] = flags[name]
        if name in ("nats", "nats_placement") and isinstance(values.get(name), str):
            values[name] = tuple(u.strip() for u in values[name].split(",") if u.strip())
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "settings"
        flag = "--" + field.replace("_", "-")
        raise SettingsError(f"{flag} (or {ENV_PREFIX}{field.upper()}): {first['msg']}") from None
    if settings.role is Role.NODE and settings.node is None:
        raise SettingsError(f"--node (or {ENV_PREFIX}NODE) is required for the node role")
    return settings


ConfigT = TypeVar("ConfigT", bound=BaseModel)


def load_config_file(path: Path | None, model: type[ConfigT], flag: str = "--config") -> ConfigT:
    """A service's `--config` file (or the file of another `flag`; YAML, which includes
    JSON) as `model`; the defaults without one. Raises `SettingsError` naming the flag, the
    file and the first wrong key."""
    if path is None:
        return model()
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise SettingsError(f"{flag} {path}: cannot read it: {error}") from None
    if not isinstance(document, dict):
        raise SettingsError(f"{flag} {path}: expected a mapping of settings")
    try:
        return model.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise SettingsError(f"{flag} {path}: {where}: {first['msg']}") from None
