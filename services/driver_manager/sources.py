"""Driver sources: where packages come from, read the same way whether local or remote.

A driver source is a directory or an http(s) URL holding `index.json` and the archives it
lists (the format `gpuop.host.packaging` writes), so an air-gapped cluster mirrors one with
any file copy or web server. `installing.install` asks `open_source(uri)` for the index,
picks the entry for (component, version, running kernel) with `select`, and has `fetch` copy
the archive into its staging directory while hashing it.

A directory is named by an absolute path or a `file://` URL, as the agent's own filesystem
sees it (in a pod, mount the mirror; `/host/srv/drivers` is the host's `/srv/drivers`).
URLs are fetched with aiohttp under the configured connect and read timeouts; aiohttp is
imported on the first fetch from a URL, not with the agent (most sources are directories,
and the import is a fifth of the agent's memory).

Failures are `SourceError`s whose `reason` is the install failure reason to report:
`source-unreachable` (retryable: the network, a server error, a missing mount) or
`not-found` (the source answered and has no such package).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Protocol
from urllib.parse import unquote, urljoin, urlsplit

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from gpuop.events.driver import InstallFailureReason
from gpuop.events.fields import Sha256, Version
from gpuop.host import packaging

CHUNK = 1 << 20
MAX_INDEX_BYTES = 16 << 20


_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redacted(text: str) -> str:
    """`text` with the credentials of every URL in it (`https://user:token@host/`) replaced
    by `***`: a source's URL travels into failure events, logs and the policy's status."""
    return _USERINFO.sub("***@", text)


class SourceError(Exception):
    """The source could not give what was asked; `reason` says how to report it. Its message
    never carries a URL's credentials (`redacted`), whoever built it."""

    def __init__(self, reason: InstallFailureReason, message: str) -> None:
        message = redacted(message)
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.reason is InstallFailureReason.SOURCE_UNREACHABLE


class IndexEntry(BaseModel):
    """One package in `index.json`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    component: str
    version: Version
    kernel_release: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    sha256: Sha256
    file: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    """Archive location relative to the source; never absolute and never climbing out."""


class SourceIndex(BaseModel):
    """`index.json`: every package the source offers."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    packages: tuple[IndexEntry, ...] = ()


@dataclass(frozen=True)
class Fetched:
    """An archive copied into staging."""

    path: Path
    sha256: str
    size: int


class DriverSource(Protocol):
    """A driver source, local or remote."""

    @property
    def uri(self) -> str: ...

    async def index(self) -> SourceIndex:
        """The parsed `index.json`."""
        ...

    async def fetch(self, entry: IndexEntry, destination: Path) -> Fetched:
        """Copy `entry`'s archive to `destination`, hashing what was written."""
        ...


def open_source(
    uri: str, *, connect_timeout: float, read_timeout: float, max_bytes: int
) -> DriverSource:
    """The source `uri` names; `SourceError(not-found)` when it names no kind we read."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        return HttpSource(uri, connect_timeout, read_timeout, max_bytes)
    if scheme == "file":
        return DirectorySource(Path(unquote(urlsplit(uri).path)), max_bytes)
    if scheme == "" and uri.startswith("/"):
        return DirectorySource(Path(uri), max_bytes)
    raise SourceError(
        InstallFailureReason.NOT_FOUND,
        f"driver source {uri!r} is neither an absolute directory path nor an http(s) URL",
    )


def select(
    index: SourceIndex, uri: str, component: str, version: str, kernel_release: str
) -> IndexEntry:
    """The package of `component` `version` built for `kernel_release`; `SourceError`
    (not-found) naming what the source has instead."""
    same = [e for e in index.packages if e.component == component and e.version == version]
    for entry in same:
        if entry.kernel_release == kernel_release:
            return entry
    if same:
        kernels = ", ".join(sorted({entry.kernel_release for entry in same}))
        detail = f"no build for kernel {kernel_release} (it has builds for: {kernels})"
    else:
        versions = sorted({e.version for e in index.packages if e.component == component})
        detail = f"no such version (it has: {', '.join(versions) or 'none'})"
    raise SourceError(
        InstallFailureReason.NOT_FOUND,
        f"driver source {uri} has no {component} {version} package: {detail}",
    )


def _parse_index(data: bytes, uri: str) -> SourceIndex:
    try:
        return SourceIndex.model_validate(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
        raise SourceError(
            InstallFailureReason.NOT_FOUND, f"{uri}: index.json is not a driver index: {exc}"
        ) from None


def _relative_file(entry: IndexEntry, uri: str) -> PurePosixPath:
    path = PurePosixPath(entry.file)
    if path.is_absolute() or ".." in path.parts or urlsplit(entry.file).scheme:
        raise SourceError(
            InstallFailureReason.NOT_FOUND,
            f"{uri}: index entry file {entry.file!r} points outside the source",
        )
    return path


class DirectorySource:
    """A driver source directory on the agent's filesystem."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    @property
    def uri(self) -> str:
        return str(self.directory)

    async def index(self) -> SourceIndex:
        if not self.directory.is_dir():
            raise SourceError(
                InstallFailureReason.SOURCE_UNREACHABLE,
                f"driver source directory {self.directory} does not exist (not mounted?)",
            )
        path = self.directory / packaging.INDEX
        try:
            data = await asyncio.to_thread(_read_limited, path, MAX_INDEX_BYTES)
        except FileNotFoundError:
            raise SourceError(
                InstallFailureReason.NOT_FOUND, f"{self.directory} has no {packaging.INDEX}"
            ) from None
        except OSError as exc:
            raise SourceError(
                InstallFailureReason.SOURCE_UNREACHABLE, f"cannot read {path}: {exc}"
            ) from None
        return _parse_index(data, self.uri)

    async def fetch(self, entry: IndexEntry, destination: Path) -> Fetched:
        path = self.directory / _relative_file(entry, self.uri)
        try:
            return await asyncio.to_thread(_copy_hashing, path, destination, self.max_bytes)
        except FileNotFoundError:
            raise SourceError(
                InstallFailureReason.NOT_FOUND, f"{path} is listed in the index but missing"
            ) from None


class HttpSource:
    """A driver source served over http(s)."""

    def __init__(self, url: str, connect: float, read: float, max_bytes: int) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self.connect, self.read = connect, read
        self.max_bytes = max_bytes

    @property
    def uri(self) -> str:
        return self.url

    async def index(self) -> SourceIndex:
        url = urljoin(self.url, packaging.INDEX)
        chunks: list[bytes] = []
        await self._get(url, lambda chunk: chunks.append(chunk), MAX_INDEX_BYTES)
        return _parse_index(b"".join(chunks), url)

    async def fetch(self, entry: IndexEntry, destination: Path) -> Fetched:
        url = urljoin(self.url, _relative_file(entry, self.uri).as_posix())
        digest = hashlib.sha256()
        with destination.open("wb") as stream:

            def write(chunk: bytes) -> None:
                stream.write(chunk)
                digest.update(chunk)

            size = await self._get(url, write, self.max_bytes)
        return Fetched(destination, digest.hexdigest(), size)

    async def _get(self, url: str, sink: _Sink, limit: int) -> int:
        """Stream `url`'s body into `sink`; its size."""
        import aiohttp

        unreachable = InstallFailureReason.SOURCE_UNREACHABLE
        timeout = aiohttp.ClientTimeout(sock_connect=self.connect, sock_read=self.read)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(url) as response,
            ):
                if response.status == 404:
                    raise SourceError(InstallFailureReason.NOT_FOUND, f"{url}: 404 Not Found")
                if response.status != 200:
                    raise SourceError(unreachable, f"{url}: HTTP {response.status}")
                size = 0
                async for chunk in response.content.iter_chunked(CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise SourceError(
                            InstallFailureReason.OTHER, f"{url} is larger than {limit} bytes"
                        )
                    sink(chunk)
                return size
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SourceError(unreachable, f"{url}: {type(exc).__name__}: {exc}") from None


class _Sink(Protocol):
    def __call__(self, chunk: bytes, /) -> None: ...


def _read_limited(path: Path, limit: int) -> bytes:
    with path.open("rb") as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise SourceError(InstallFailureReason.OTHER, f"{path} is larger than {limit} bytes")
    return data


def _copy_hashing(source: Path, destination: Path, limit: int) -> Fetched:
    digest = hashlib.sha256()
    size = 0
    with source.open("rb") as reader, destination.open("wb") as writer:
        while chunk := reader.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise SourceError(InstallFailureReason.OTHER, f"{source} is larger than {limit}")
            writer.write(chunk)
            digest.update(chunk)
    return Fetched(destination, digest.hexdigest(), size)
