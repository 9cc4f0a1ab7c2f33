"""Driver sources: a directory and an http(s) mirror of it serve the same packages, and a
package that tries to escape its directory is refused."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import socket
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gpuop.events import driver as dm
from gpuop.host import packages, packaging
from gpuop.host.roots import HostRoot
from gpuop.observability.redaction import redacted
from gpuop.services.driver_manager import installing
from tests.support.driver_manager import KERNEL, NEW, OLD, Harness, rewrite_index, source_of


@pytest.fixture
async def http_source(source: Path) -> AsyncIterator[str]:
    """`source` served at http://127.0.0.1:<port>/drivers/, as an air-gapped mirror would."""
    app = web.Application()
    app.router.add_static("/drivers/", source)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/drivers"
    finally:
        await runner.cleanup()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_install_from_an_http_source(
    harness: Harness, host: HostRoot, http_source: str, source: Path
) -> None:
    answer = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(http_source))
    )
    assert isinstance(answer, dm.DriverInstalled)
    assert answer.sha256 == packaging.sha256_of(source / packaging.archive_name("gpu", NEW, KERNEL))
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD, NEW)


async def test_an_http_source_without_the_package_or_the_index(
    harness: Harness, http_source: str, source: Path
) -> None:
    (source / packaging.archive_name("gpu", NEW, KERNEL)).unlink()
    missing = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(http_source))
    )
    assert isinstance(missing, dm.DriverInstallFailed)
    assert missing.reason is dm.InstallFailureReason.NOT_FOUND
    assert "404 Not Found" in missing.message and not missing.retryable
    no_index = await harness.send(
        dm.InstallDriver(
            component=dm.Component.GPU,
            version=NEW,
            source=source_of(http_source + "/nowhere/"),
        )
    )
    assert isinstance(no_index, dm.DriverInstallFailed)
    assert no_index.reason is dm.InstallFailureReason.NOT_FOUND


async def test_a_source_urls_credentials_never_reach_the_result_or_the_log(
    harness: Harness, http_source: str, source: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    (source / packaging.archive_name("gpu", NEW, KERNEL)).unlink()
    with_credentials = http_source.replace("http://", "http://fetcher:s3cret-token@")
    unreachable = f"https://fetcher:s3cret-token@127.0.0.1:{free_port()}/drivers/"
    for uri in (with_credentials, unreachable):
        failed = await harness.send(
            dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(uri))
        )
        assert isinstance(failed, dm.DriverInstallFailed)
        assert "s3cret" not in failed.message
        assert "://fetcher:***@127.0.0.1:" in failed.message or "Cannot connect" in failed.message
    assert "s3cret" not in caplog.text


def test_redaction_covers_every_url_in_a_message() -> None:
    said = redacted("a https://u:p@h1/x failed, then http://token@h2:8080/y; /plain/path stays")
    assert said == "a https://u:***@h1/x failed, then http://***@h2:8080/y; /plain/path stays"
    assert redacted("no url here: user@host") == "no url here: user@host"


async def test_an_unreachable_source_is_retryable(harness: Harness, host: HostRoot) -> None:
    failed = await harness.send(
        dm.InstallDriver(
            component=dm.Component.GPU,
            version=NEW,
            source=source_of(f"http://127.0.0.1:{free_port()}/drivers/"),
        )
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.SOURCE_UNREACHABLE
    assert failed.retryable
    absent = await harness.send(
        dm.InstallDriver(
            component=dm.Component.GPU, version=NEW, source=source_of(host.path / "no-mirror")
        )
    )
    assert isinstance(absent, dm.DriverInstallFailed)
    assert absent.reason is dm.InstallFailureReason.SOURCE_UNREACHABLE
    assert "does not exist (not mounted?)" in absent.message


async def test_a_file_url_names_a_directory_and_a_relative_path_names_nothing(
    harness: Harness, source: Path
) -> None:
    answer = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source.as_uri()))
    )
    assert isinstance(answer, dm.DriverInstalled)
    relative = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version="590.1", source=source_of("drivers"))
    )
    assert isinstance(relative, dm.DriverInstallFailed)
    assert "under no allowed source prefix" in relative.message


def evil_archive(path: Path, members: list[tuple[str, bytes]]) -> str:
    raw = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w") as archive,
    ):
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    path.write_bytes(raw.getvalue())
    return hashlib.sha256(raw.getvalue()).hexdigest()


async def test_a_member_that_climbs_out_of_the_package_is_refused(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    archive = source / packaging.archive_name("gpu", NEW, KERNEL)
    standin = packages.standins_for("gpu", NEW, KERNEL)[0]
    digest = evil_archive(
        archive, [("nvidia.ko", standin.encode()), ("../../../../../etc/evil", b"owned")]
    )
    rewrite_index(source, {archive.name: {"sha256": digest}})
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert "would be written outside the package directory" in failed.message
    assert not host.join("etc/evil").exists()
    assert not list(packages.component_dir(host, KERNEL, "gpu").glob(".staging-*"))
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)


async def test_a_package_whose_manifest_names_another_version_is_refused(
    harness: Harness, source: Path
) -> None:
    # the archive of OLD listed under NEW: the digest matches, the content does not
    archive = source / packaging.archive_name("gpu", OLD, KERNEL)
    rewrite_index(
        source,
        {
            packaging.archive_name("gpu", NEW, KERNEL): {
                "file": archive.name,
                "sha256": packaging.sha256_of(archive),
            }
        },
    )
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.VERIFICATION_FAILED
    assert f"says it holds gpu {OLD} {KERNEL}" in failed.message


async def test_an_index_entry_pointing_outside_the_source_is_refused(
    harness: Harness, source: Path
) -> None:
    rewrite_index(
        source, {packaging.archive_name("gpu", NEW, KERNEL): {"file": "../../etc/shadow"}}
    )
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert "points outside the source" in failed.message


async def test_an_archive_of_too_many_files_is_refused_before_it_exhausts_the_inodes(
    harness: Harness, host: HostRoot, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(installing, "MAX_MEMBERS", 3)
    archive = source / packaging.archive_name("gpu", NEW, KERNEL)
    standin = packages.standins_for("gpu", NEW, KERNEL)[0]
    many = [("nvidia.ko", standin.encode())] + [(f"empty-{i}", b"") for i in range(5)]
    rewrite_index(source, {archive.name: {"sha256": evil_archive(archive, many)}})
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert "holds more than 3 files" in failed.message
    assert not list(packages.component_dir(host, KERNEL, "gpu").glob(".staging-*"))
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)


async def test_a_package_larger_than_the_free_space_is_refused_before_it_is_written(
    harness: Harness, host: HostRoot, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.disk_usage

    def nearly_full(path: object) -> object:
        usage = real(path)  # type: ignore[arg-type]
        return usage._replace(free=installing.SPACE_RESERVE_BYTES + 10)

    monkeypatch.setattr(shutil, "disk_usage", nearly_full)
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.NO_SPACE and failed.retryable
    assert "less than 256 MiB free" in failed.message
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)
