"""A nats-server whose users are per-node identities: `gpuop.bus.grants.for_identity`
rendered for several (role, node) pairs as password users of one account, what an auth
callout or per-node JWTs would give each node's agents. The per-node attack tests run it."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from gpuop.bus import NatsBus, grants, launcher
from gpuop.bus.errors import BusUnavailable

ADMIN = "admin"


def user_name(identity: grants.Identity) -> str:
    """The user of `identity` in the rendered configuration."""
    return identity.role if identity.node is None else f"{identity.role}--{identity.node}"


def _quoted(subjects: tuple[str, ...]) -> str:
    return ", ".join(json.dumps(subject) for subject in subjects)


def render(identities: list[grants.Identity], passwords: dict[str, str], store: Path) -> str:
    """A nats-server configuration on 127.0.0.1 (random port) with one user per identity,
    permitted exactly `grants.for_identity`, and `admin`."""
    users = []
    for identity in identities:
        granted = grants.for_identity(identity)
        deny = f", deny: [{_quoted(granted.deny_publish)}]" if granted.deny_publish else ""
        users.append(
            f"      {{ user: {json.dumps(user_name(identity))}, "
            f"password: {json.dumps(passwords[user_name(identity)])},\n"
            f"        permissions: {{\n"
            f"          publish: {{ allow: [{_quoted(granted.publish)}]{deny} }}\n"
            f"          subscribe: {{ allow: [{_quoted(granted.subscribe)}] }}\n"
            f"        }} }}"
        )
    users.append(f"      {{ user: {ADMIN}, password: {json.dumps(passwords[ADMIN])} }}")
    joined = ",\n".join(users)
    return (
        "listen: 127.0.0.1:-1\n"
        f"jetstream {{ store_dir: {json.dumps(str(store))}, max_memory_store: 256MB, "
        "max_file_store: 10GB }\n"
        "accounts {\n  GPUOP {\n    jetstream: enabled\n    users: [\n"
        f"{joined}\n    ]\n  }}\n}}\n"
    )


@dataclass
class PerNodeNats:
    """The rendered configuration in a real nats-server."""

    workdir: Path
    identities: list[grants.Identity]
    passwords: dict[str, str] = field(default_factory=dict)
    port: int = 0
    _process: object = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in [*map(user_name, self.identities), ADMIN]:
            self.passwords[name] = "p" + secrets.token_hex(12)

    @property
    def log_file(self) -> Path:
        return self.workdir / "nats.log"

    async def start(self) -> None:
        config = self.workdir / "nats.conf"
        config.write_text(
            render(self.identities, self.passwords, self.workdir / "jetstream"), encoding="utf-8"
        )
        ports = self.workdir / "ports"
        ports.mkdir(exist_ok=True)
        try:
            self._process, found = await launcher.run_server(config, ports, log=self.log_file)
        except BusUnavailable:
            raise AssertionError(
                f"nats-server did not start:\n{self.log_file.read_text()}"
            ) from None
        self.port = int(found["nats"][0].rsplit(":", 1)[1])

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            await launcher.terminate(process)  # type: ignore[arg-type]

    def url(self, name: str) -> str:
        return f"nats://{name}:{self.passwords[name]}@127.0.0.1:{self.port}"

    def bus(self, identity: grants.Identity | None, **options: object) -> NatsBus:
        """A NatsBus as `identity` (None: admin), with its inbox prefix."""
        name = ADMIN if identity is None else user_name(identity)
        return NatsBus(self.url(name), name=f"test-{name}", identity=identity, **options)  # type: ignore[arg-type]
