"""A driver source's index is believed only when signed by a key the node's anchor (and the
command, narrowing it) trusts: an index changed after signing, signed by another key, with a
forged trusted comment or unsigned is refused (unsigned only with `allow_unsigned`, where the
anchor allows it too), plain http needs a signature, https stays https, and the anchor's CA
bundle replaces the node's trust store. The agents here run under an anchor that allows
unsigned indexes and trusts `ca`, so each check below the anchor shows on its own."""

from __future__ import annotations

import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.host import packages, packaging, signing
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager.anchors import TrustAnchor
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop_sim.host import keys
from tests.support.driver_manager import (
    KERNEL,
    NEW,
    OLD,
    TRUSTED,
    Harness,
    rewrite_index,
    running_agent,
    source_of,
)

pytestmark = pytest.mark.security

SIGNATURE = packaging.INDEX + signing.SUFFIX
NEW_ARCHIVE = packaging.archive_name("gpu", NEW, KERNEL)


def install(source: dm.DriverSource) -> dm.InstallDriver:
    return dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source)


async def refused(harness: Harness, source: dm.DriverSource) -> dm.DriverInstallFailed:
    answer = await harness.send(install(source))
    assert isinstance(answer, dm.DriverInstallFailed), answer
    assert answer.reason is dm.InstallFailureReason.VERIFICATION_FAILED, answer.message
    assert not answer.retryable
    return answer


async def serve(app: web.Application, context: ssl.SSLContext | None = None) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    return runner


def port_of(runner: web.AppRunner) -> int:
    return int(runner.addresses[0][1])


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def http_url(source: Path) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_static("/drivers/", source)
    runner = await serve(app)
    try:
        yield f"http://127.0.0.1:{port_of(runner)}/drivers/"
    finally:
        await runner.cleanup()


@pytest.fixture
async def https_url(source: Path, ca: trustme.CA) -> AsyncIterator[str]:
    """`source` over https with a certificate for 127.0.0.1 that only `ca` vouches for."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    app = web.Application()
    app.router.add_static("/drivers/", source)
    runner = await serve(app, context)
    try:
        yield f"https://127.0.0.1:{port_of(runner)}/drivers/"
    finally:
        await runner.cleanup()


def ca_pem(ca: trustme.CA) -> str:
    return ca.cert_pem.bytes().decode()


@pytest.fixture
async def harness(
    bus: InMemoryBus, host: HostRoot, source: Path, ca: trustme.CA
) -> AsyncIterator[Harness]:
    """An agent whose anchor allows unsigned indexes and trusts `ca`."""
    lax = TRUSTED.model_copy(update={"allow_unsigned": True, "ca_bundle": ca_pem(ca)})
    async with running_agent(bus, host, source, DriverManagerConfig(trust=lax)) as running:
        yield running


async def test_a_signed_index_installs(harness: Harness, host: HostRoot) -> None:
    answer = await harness.send(install(source_of(harness.source)))
    assert isinstance(answer, dm.DriverInstalled), answer
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD, NEW)


async def test_an_index_changed_after_signing_is_refused(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    # a mirror that points the entry at another archive, keeping the publisher's signature
    old = packaging.sha256_of(source / packaging.archive_name("gpu", OLD, KERNEL))
    rewrite_index(source, {NEW_ARCHIVE: {"sha256": old}}, sign=False)
    failed = await refused(harness, source_of(source))
    assert f"{SIGNATURE} does not verify" in failed.message
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)


async def test_an_index_signed_by_an_untrusted_key_is_refused_even_when_unsigned_is_allowed(
    harness: Harness, source: Path
) -> None:
    packaging.sign_driver_source(source, signing.SecretKey.generate())
    failed = await refused(harness, source_of(source))
    assert "not a trusted key" in failed.message
    lax = source_of(source).model_copy(update={"allow_unsigned": True})
    assert "not a trusted key" in (await refused(harness, lax)).message


async def test_a_forged_trusted_comment_is_refused(harness: Harness, source: Path) -> None:
    path = source / SIGNATURE
    lines = path.read_text().split("\n")
    lines[2] = "trusted comment: timestamp:4102444800\tfile:index.json\thashed"
    path.write_text("\n".join(lines))
    failed = await refused(harness, source_of(source))
    assert "trusted comment's signature does not verify" in failed.message


async def test_a_missing_signature_is_refused_unless_the_policy_allows_unsigned(
    harness: Harness, host: HostRoot, source: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (source / SIGNATURE).unlink()
    failed = await refused(harness, source_of(source))
    assert f"has no {SIGNATURE}" in failed.message and "allowUnsigned" in failed.message
    unsigned = dm.DriverSource(uri=str(source), allow_unsigned=True)
    answer = await harness.send(install(unsigned))
    assert isinstance(answer, dm.DriverInstalled), answer
    assert "is not signed; installing from it" in caplog.text


async def test_a_signed_index_needs_a_trusted_key_listed(
    bus: InMemoryBus, host: HostRoot, source: Path
) -> None:
    keyless = DriverManagerConfig(trust=TrustAnchor(sources=TRUSTED.sources))
    async with running_agent(bus, host, source, keyless) as bare:
        failed = await refused(bare, dm.DriverSource(uri=str(source)))
    assert "lists no publicKeys" in failed.message


async def test_a_legacy_signature_verifies(harness: Harness, source: Path) -> None:
    data = (source / packaging.INDEX).read_bytes()
    legacy = signing.sign(data, keys.SIGNING_KEY, "legacy", legacy=True)
    (source / SIGNATURE).write_text(legacy.file_text())
    assert isinstance(await harness.send(install(source_of(source))), dm.DriverInstalled)


async def test_the_commands_digest_must_be_the_signed_entrys(
    harness: Harness, source: Path
) -> None:
    wrong = packaging.sha256_of(source / packaging.archive_name("gpu", OLD, KERNEL))
    failed = await refused(harness, source_of(source, wrong))
    assert f"the command expects {wrong}" in failed.message
    right = packaging.sha256_of(source / NEW_ARCHIVE)
    answer = await harness.send(install(source_of(source, right)))
    assert isinstance(answer, dm.DriverInstalled) and answer.sha256 == right


async def test_plain_http_needs_a_signature_whatever_allow_unsigned_says(
    harness: Harness, http_url: str, source: Path
) -> None:
    (source / SIGNATURE).unlink()
    lax = dm.DriverSource(uri=http_url, allow_unsigned=True)
    failed = await refused(harness, lax)
    assert "plain http:// must be signed" in failed.message
    packaging.sign_driver_source(source, keys.SIGNING_KEY)
    assert isinstance(await harness.send(install(source_of(http_url))), dm.DriverInstalled)


async def test_an_https_source_trusts_the_anchors_ca_alone(
    bus: InMemoryBus,
    harness: Harness,
    host: HostRoot,
    source: Path,
    https_url: str,
    ca: trustme.CA,
) -> None:
    async with running_agent(bus, host, source, DriverManagerConfig(trust=TRUSTED)) as store:
        # an anchor without a CA: the node's trust store does not vouch for the server
        failed = await store.send(install(source_of(https_url)))
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.SOURCE_UNREACHABLE
    assert "certificate" in failed.message.lower()
    other = source_of(https_url).model_copy(update={"ca_bundle": ca_pem(trustme.CA())})
    assert "CA bundle the node does not trust" in (await refused(harness, other)).message
    for bundle in (None, ca_pem(ca)):
        answer = await harness.send(
            install(source_of(https_url).model_copy(update={"ca_bundle": bundle}))
        )
        assert isinstance(answer, dm.DriverInstalled), answer
        shutil.rmtree(packages.package_dir(host, KERNEL, "gpu", NEW))


async def test_a_redirect_from_https_to_http_is_refused(
    harness: Harness, http_url: str, ca: trustme.CA
) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)

    async def downgrade(request: web.Request) -> web.Response:
        raise web.HTTPFound(http_url + request.match_info["name"])

    app = web.Application()
    app.router.add_get("/drivers/{name}", downgrade)
    runner = await serve(app, context)
    try:
        url = f"https://127.0.0.1:{port_of(runner)}/drivers/"
        source = source_of(url).model_copy(update={"ca_bundle": ca_pem(ca)})
        failed = await refused(harness, source)
    finally:
        await runner.cleanup()
    assert "redirected from https to http://127.0.0.1" in failed.message
