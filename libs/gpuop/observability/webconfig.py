"""TLS and basic auth for a service's /metrics, from a Prometheus web-config file.

The file is the one Prometheus' exporters read (`--web.config.file` of the exporter
toolkit), so the same Secret serves gpuop and the node exporter:

    tls_server_config:
      cert_file: tls.crt            # relative paths are read beside this file
      key_file: tls.key
      client_ca_file: ca.crt        # with client_auth_type, mutual TLS
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...        # bcrypt hashes, as `htpasswd -nBC 10` prints them

TLS covers the whole listener (the kubelet's probes then use `scheme: HTTPS`). Basic auth
guards `/metrics` only: `/healthz` and `/readyz` tell whether the process runs and why it is
not ready, the kubelet probes them without credentials, and they reveal no metric. A bcrypt
check costs tens of milliseconds by design, so a password that passed is remembered (by its
SHA-256, per user) for the process's life, as the exporter toolkit caches it; a wrong one is
checked again every time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ClientAuth = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TlsVersion = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_REMEMBERED_MAX = 64


class TlsServerConfig(BaseModel):
    """The exporter toolkit's `tls_server_config` (the keys gpuop honours)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion = "TLS13"


class WebConfig(BaseModel):
    """A Prometheus web-config file: TLS for the listener, basic auth for /metrics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = Field(default_factory=dict)
    http_server_config: dict[str, object] = Field(default_factory=dict)
    """Accepted for compatibility; its HTTP/2 and header settings are not applied."""

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if not user or ":" in user:
                raise ValueError(f"user name {user!r} is empty or holds a colon")
            if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
                raise ValueError(f"the password of {user!r} is not a bcrypt hash ($2y$...)")
        return users

    def resolved(self, directory: Path) -> WebConfig:
        """This config with its file paths read relative to `directory` (the file's own)."""
        tls = self.tls_server_config
        if tls is None:
            return self

        def beside(path: Path | None) -> Path | None:
            return None if path is None else directory / path

        located = tls.model_copy(
            update={
                "cert_file": directory / tls.cert_file,
                "key_file": directory / tls.key_file,
                "client_ca_file": beside(tls.client_ca_file),
            }
        )
        return self.model_copy(update={"tls_server_config": located})

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server side of TLS, or None without `tls_server_config`; raises `OSError` or
        `ssl.SSLError` for files that cannot be read or do not match."""
        tls = self.tls_server_config
        if tls is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _VERSIONS[tls.min_version]
        context.maximum_version = _VERSIONS[tls.max_version]
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_auth_type != "NoClientCert":
            if tls.client_ca_file is not None:
                context.load_verify_locations(tls.client_ca_file)
            required = tls.client_auth_type in (
                "RequireAnyClientCert",
                "RequireAndVerifyClientCert",
            )
            context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
        return context


class BasicAuth:
    """Checks `Authorization: Basic ...` against the config's bcrypt hashes."""

    def __init__(self, users: dict[str, str]) -> None:
        self._users = users
        self._passed: dict[str, bytes] = {}
        """User -> SHA-256 of the password that last passed its bcrypt check."""

    @property
    def required(self) -> bool:
        return bool(self._users)

    def allows(self, authorization: str) -> bool:
        """Whether the header names a configured user and its password."""
        if not self._users:
            return True
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, colon, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if not colon or hashed is None:
            return False
        digest = hashlib.sha256(password.encode()).digest()
        if self._passed.get(user) == digest:
            return True
        import bcrypt  # only a process with basic auth configured pays for it

        if not bcrypt.checkpw(password.encode(), hashed.encode()):
            return False
        if len(self._passed) < _REMEMBERED_MAX or user in self._passed:
            self._passed[user] = digest
        return True
