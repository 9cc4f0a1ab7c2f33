"""TLS and basic auth on the health server, from a Prometheus web-config file."""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import trustme
from prometheus_client import CollectorRegistry

from gpuop.observability.http import HealthServer
from gpuop.observability.webconfig import BasicAuth, WebConfig
from gpuop.runtime.launching import load_web_config
from gpuop.runtime.settings import SettingsError

HASH = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(rounds=4)).decode()


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def url(server: HealthServer, path: str, scheme: str = "http") -> str:
    assert server.address is not None
    host, port = server.address
    return f"{scheme}://{host}:{port}{path}"


async def test_metrics_need_the_password_and_the_probes_do_not(client):
    config = WebConfig(basic_auth_users={"prometheus": HASH})
    async with HealthServer(CollectorRegistry(), web_config=config) as server:
        async with client.get(url(server, "/metrics")) as anonymous:
            assert anonymous.status == 401
            assert anonymous.headers["WWW-Authenticate"].startswith("Basic realm=")
        async with client.get(url(server, "/metrics"), headers=basic("prometheus", "no")) as bad:
            assert bad.status == 401
        async with client.get(url(server, "/metrics"), headers=basic("nobody", "scrape-me")) as who:
            assert who.status == 401
        async with client.get(
            url(server, "/metrics"), headers=basic("prometheus", "scrape-me")
        ) as ok:
            assert ok.status == 200
        for probe in ("/healthz", "/readyz"):
            async with client.get(url(server, probe)) as answer:
                assert answer.status == 200, probe


def test_a_password_that_passed_is_not_hashed_again_and_a_wrong_one_always_is(monkeypatch):
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    auth = BasicAuth({"prometheus": HASH})
    header = basic("prometheus", "scrape-me")["Authorization"]
    assert auth.allows(header) and auth.allows(header)
    assert len(calls) == 1
    wrong = basic("prometheus", "guess")["Authorization"]
    assert not auth.allows(wrong) and not auth.allows(wrong)
    assert len(calls) == 3
    for garbage in ("Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode(), ""):
        assert not auth.allows(garbage), garbage


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[trustme.CA, Path]:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp_path / "ca.crt")
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(tmp_path / "tls.crt")
    leaf.private_key_pem.write_to_path(tmp_path / "tls.key")
    return ca, tmp_path


async def test_tls_from_aload_web_config_file_with_paths_beside_it(certificates, client):
    _, directory = certificates
    (directory / "web.yml").write_text(
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
    )
    config = load_web_config(directory / "web.yml")
    trusting = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    async with HealthServer(CollectorRegistry(), web_config=config) as server:
        async with client.get(url(server, "/healthz", "https"), ssl=trusting) as answer:
            assert answer.status == 200
        with pytest.raises(aiohttp.ClientError):  # plain HTTP gets no answer from a TLS port
            await client.get(url(server, "/healthz"))
        async with client.get(url(server, "/healthz", "https"), ssl=trusting) as again:
            assert again.status == 200  # the failed handshake left the server serving


async def test_mutual_tls_refuses_a_client_without_a_certificate(certificates, client):
    ca, directory = certificates
    (directory / "web.yml").write_text(
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
        "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"
    )
    config = load_web_config(directory / "web.yml")
    trusting = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    async with HealthServer(CollectorRegistry(), web_config=config) as server:
        with pytest.raises(aiohttp.ClientError):
            async with client.get(url(server, "/healthz", "https"), ssl=trusting) as refused:
                await refused.read()
        ca.issue_cert("prometheus").configure_cert(trusting)
        async with client.get(url(server, "/healthz", "https"), ssl=trusting) as answer:
            assert answer.status == 200


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("basic_auth_users:\n  prometheus: plain-text\n", "is not a bcrypt hash"),
        (
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
            "TLS files do not load",
        ),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: SSL3\n", "min_version"),
        ("basic_auth: {}\n", "basic_auth"),
        ("- not a mapping\n", "expected a mapping"),
    ],
)
def test_a_wrong_web_config_stops_the_start_naming_the_flag(tmp_path: Path, text: str, said: str):
    (tmp_path / "web.yml").write_text(text)
    with pytest.raises(SettingsError, match="--metrics-web-config") as raised:
        load_web_config(tmp_path / "web.yml")
    assert said in str(raised.value)
