"""deploy/nats as shipped, in a real nats-server on loopback, for the permission tests.

Only what cannot be the same on a test machine is rewritten, each line checked to exist
exactly once so that a change of the shipped file fails loudly: the client and monitoring
addresses (127.0.0.1, random ports), the JetStream store and the TLS files (a throwaway CA
from trustme). Users, permissions, limits and TLS itself run as shipped, and the passwords
come from <USER>_PASSWORD variables as in the Helm chart. The server traces what each
client sends, so a test can ask which subjects a user published and which were refused.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import trustme
from nats.aio.client import Client

from gpuop.bus import NatsBus, grants, launcher
from gpuop.bus.errors import BusUnavailable

REPO = Path(__file__).resolve().parents[2]
NATS_DIR = REPO / "deploy" / "nats"
CONFIG = "nats-server.conf"
SENTINEL = "test.sentinel"
"""A subject nobody but admin may publish to."""
ACCOUNTS = "accounts.conf"
NODE = "gpu-1.example.com"
"""The node a test's node agents run on."""

_USER = re.compile(r'user:\s*"(?P<name>[^"]+)"\s*password:\s*\$(?P<variable>[A-Z_]+)')
_PUBLISH_ALLOW = re.compile(r"publish:\s*\{\s*allow:\s*\[(?P<subjects>[^\]]*)\]", re.S)
_VIOLATION = re.compile(
    r'"GPUOP/user:(?P<user>[^"]+)" - (?P<kind>Publish|Subscription) Violation - '
    r'(?:Subject "(?P<subject>[^"]+)"|.*?Subject "(?P<sub_subject>[^"]+)")'
)
_TRACED_PUB = re.compile(r'"GPUOP/user:(?P<user>[^"]+)" - <<- \[H?PUB (?P<subject>\S+)')


@dataclass(frozen=True)
class ShippedUser:
    """One user of accounts.conf, as the file has it."""

    name: str
    password_variable: str
    publish_allow: tuple[str, ...]
    """The subjects of its `publish.allow` list (empty for observer and admin)."""


def shipped_users() -> dict[str, ShippedUser]:
    """Every user of deploy/nats/accounts.conf, in file order."""
    text = (NATS_DIR / ACCOUNTS).read_text(encoding="utf-8")
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    starts = [m.start() for m in _USER.finditer(code)] + [len(code)]
    users: dict[str, ShippedUser] = {}
    for match, end in zip(_USER.finditer(code), starts[1:], strict=True):
        block = code[match.start() : end]
        allow = _PUBLISH_ALLOW.search(block)
        listed = re.findall(r'"([^"]+)"', allow["subjects"]) if allow else []
        users[match["name"]] = ShippedUser(match["name"], match["variable"], tuple(listed))
    return users


def identity_of(user: str, node: str = NODE) -> grants.Identity | None:
    """The identity a service of `user` connects as (None for admin and people's tools)."""
    if user in grants.NODE_ROLES:
        return grants.Identity(user, node)
    if user in grants.CLUSTER_ROLES:
        return grants.Identity(user, None)
    return None


def inbox_of(user: str, node: str = NODE) -> str:
    """Where `user`'s replies arrive: its identity's inbox prefix, nats-py's `_INBOX` for admin."""
    identity = identity_of(user, node)
    return grants.inbox_prefix(identity) if identity is not None else "_INBOX"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: `*` is one token, a final `>` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


@dataclass(frozen=True)
class Violation:
    user: str
    kind: str
    """`Publish` or `Subscription`."""
    subject: str


def rewrite(text: str, replacements: dict[str, str], *, name: str = f"deploy/nats/{CONFIG}") -> str:
    """`text` of the file `name` with each of `replacements`, which must occur exactly once."""
    for old, new in replacements.items():
        count = text.count(old)
        if count != 1:
            raise AssertionError(f"{name} has {old!r} {count} times, expected once")
        text = text.replace(old, new)
    return text


def write_certificate(directory: Path) -> Path:
    """tls.crt and tls.key for localhost and 127.0.0.1 from a throwaway CA, and the CA as
    ca.crt, in `directory` (the keys of the chart's TLS Secret); the CA's path."""
    authority = trustme.CA()
    certificate = authority.issue_cert("localhost", "127.0.0.1")
    certificate.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    certificate.private_key_pem.write_to_path(str(directory / "tls.key"))
    authority.cert_pem.write_to_path(str(directory / "ca.crt"))
    return directory / "ca.crt"


def loopback_config(text: str, *, store: Path, tls: Path) -> str:
    """nats-server.conf on 127.0.0.1 (random client and monitoring ports), its JetStream store
    in `store` and its TLS files from `tls`."""
    return rewrite(
        text,
        {
            "listen: 0.0.0.0:4222": "listen: 127.0.0.1:-1",
            "http: 0.0.0.0:8222": "http: 127.0.0.1:-1",
            '"/data/jetstream"': f'"{store}"',
            '"/etc/nats/tls/tls.crt"': f'"{tls / "tls.crt"}"',
            '"/etc/nats/tls/tls.key"': f'"{tls / "tls.key"}"',
        },
    )


@dataclass
class ShippedNats:
    """The shipped configuration in a nats-server process; `start()` it in a temp dir."""

    workdir: Path
    trace: bool = False
    """Trace every client message (for `published_by`); costs a little speed."""
    passwords: dict[str, str] = field(default_factory=dict)
    port: int = 0
    ca_file: Path = field(init=False)
    _process: asyncio.subprocess.Process | None = None

    def __post_init__(self) -> None:
        self.ca_file = self.workdir / "ca.crt"
        # nats-server parses the variables as configuration values: a password must begin
        # with a letter, or it is read as a number
        self.passwords = {name: "p" + secrets.token_hex(16) for name in shipped_users()}

    @property
    def log_file(self) -> Path:
        return self.workdir / "nats-server.log"

    async def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_certificate(self.workdir)
        config = loopback_config(
            (NATS_DIR / CONFIG).read_text(encoding="utf-8"),
            store=self.workdir / "jetstream",
            tls=self.workdir,
        )
        (self.workdir / CONFIG).write_text(config, encoding="utf-8")
        (self.workdir / ACCOUNTS).write_bytes((NATS_DIR / ACCOUNTS).read_bytes())
        ports = self.workdir / "ports"
        ports.mkdir(exist_ok=True)
        users = shipped_users()
        env = {users[name].password_variable: password for name, password in self.passwords.items()}
        trace = ["-V", "--max_traced_msg_len", "64"] if self.trace else []
        try:
            self._process, ports_of = await launcher.run_server(
                self.workdir / CONFIG, ports, arguments=trace, env=env, log=self.log_file,
                timeout=timeout,
            )  # fmt: skip
        except BusUnavailable:
            raise AssertionError(
                f"nats-server did not start:\n{self.log_file.read_text()}"
            ) from None
        self.port = int(ports_of["nats"][0].rsplit(":", 1)[1])

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            await launcher.terminate(process)

    def url(self, user: str, *, password: str | None = None, scheme: str = "tls") -> str:
        """The URL a service of `user` connects with (the chart's GPUOP_NATS)."""
        secret = self.passwords[user] if password is None else password
        return f"{scheme}://{user}:{secret}@localhost:{self.port}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def bus(self, user: str, *, node: str = NODE, **options: Any) -> NatsBus:
        """A NatsBus as `user` (the service of `user` on `node`, with its identity, as the
        service runtime connects); the test sets SSL_CERT_FILE, as the chart does."""
        options.setdefault("identity", identity_of(user, node))
        return NatsBus(self.url(user), name=f"test-{user}", **options)

    @asynccontextmanager
    async def client(
        self, user: str, *, node: str = NODE, inbox: str | None = None
    ) -> AsyncIterator[Refusals]:
        """A raw nats-py connection as `user` that records what the server refused; replies
        on `user`'s own inbox prefix unless `inbox` says another."""
        refusals = Refusals()
        nc = await nats.connect(
            self.url(user),
            tls=self.tls(),
            inbox_prefix=inbox if inbox is not None else inbox_of(user, node),
            name=f"test-raw-{user}",
            error_cb=refusals.record,
            allow_reconnect=False,
            connect_timeout=5,
        )
        refusals.nc = nc
        try:
            yield refusals
        finally:
            await nc.close()

    def log_lines(self) -> Iterator[str]:
        with self.log_file.open(encoding="utf-8", errors="replace") as log:
            yield from log

    def violations(self) -> list[Violation]:
        found = []
        for line in self.log_lines():
            match = _VIOLATION.search(line)
            if match:
                subject = match["subject"] or match["sub_subject"]
                found.append(Violation(match["user"], match["kind"], subject))
        return found

    def published_by(self, user: str) -> set[str]:
        """Every subject `user` published to (needs `trace`)."""
        return {
            match["subject"]
            for line in self.log_lines()
            if (match := _TRACED_PUB.search(line)) and match["user"] == user
        }


async def stored(bus: NatsBus, subject: str) -> int:
    """How many messages the streams hold on `subject`."""
    return len([message async for message in bus.read(subject)])


@dataclass
class Refusals:
    """A raw connection, and the permission violations the server answered it with."""

    nc: Client = field(init=False)
    errors: list[str] = field(default_factory=list)

    async def record(self, error: Exception) -> None:
        self.errors.append(str(error))

    async def settle(self, timeout: float = 5.0) -> None:
        """Wait until the server has answered everything sent so far. A PONG may overtake
        the -ERR of a refused publish, so the proof is the refusal of one more publish that
        every user but admin is refused, sent last."""
        await self.nc.publish(SENTINEL, b"")
        await self.nc.flush()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.refused_publish(SENTINEL):
            if loop.time() > deadline:
                raise AssertionError(f"no refusal of {SENTINEL} within {timeout} s: {self.errors}")
            await asyncio.sleep(0.01)

    # nats-py reports the server's -ERR lower-cased, subject included
    def refused_publish(self, subject: str) -> bool:
        expected = f'nats: permissions violation for publish to "{subject}"'.lower()
        return expected in (error.lower() for error in self.errors)

    def refused_subscription(self, subject: str) -> bool:
        expected = f'nats: permissions violation for subscription to "{subject}"'.lower()
        return expected in (error.lower() for error in self.errors)
