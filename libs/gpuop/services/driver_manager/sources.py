"""Driver sources: where packages come from, read the same way whether local or remote.

A driver source is a directory or an http(s) URL holding `index.json`, its minisign signature
`index.json.minisig` and the archives it lists (the format `gpuop.host.packaging` writes), so
an air-gapped cluster mirrors one with any file copy or web server. `installing.install` asks
`open_source(source)` for the index, which is believed only once `verifying.check_index` has
checked its signature against the command's trusted keys; picks the entry for (component,
version, running kernel) with `select`, and has `fetch` copy the archive into its staging
directory while hashing it.

A directory is named by an absolute path or a `file://` URL, as the agent's own filesystem
sees it (in a pod, mount the mirror; `/host/srv/drivers` is the host's `/srv/drivers`).
URLs are fetched with aiohttp under the configured connect and read timeouts; aiohttp is
imported on the first fetch from a URL, not with the agent (most sources are directories,
and the import is a fifth of the agent's memory). The session honours `HTTPS_PROXY`,
`HTTP_PROXY` and `NO_PROXY` (`trust_env`); an https source with a `ca_bundle` trusts that
bundle alone, not the node's store; a redirect from https to anything else is refused.

Failures are `SourceError`s whose `reason` is the install failure reason to report:
`source-unreachable` (retryable: the network, a server error, a missing mount),
`not-found` (the source answered and has no such package) or `verification-failed` (an
index that is unsigned, badly signed, or a redirect off https).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal, Protocol
from urllib.parse import unquote, urljoin, urlsplit

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from gpuop.events import driver as dm
from gpuop.events.driver import InstallFailureReason
from gpuop.events.fields import Sha256, Version
from gpuop.host import packaging
from gpuop.observability.redaction import redacted
from gpuop.services.driver_manager import verifying

CHUNK = 1 << 20
MAX_INDEX_BYTES = 16 << 20


class SourceError(Exception):
    """The source could not give what was asked; `reason` says how to report it. Its message
    never carries a URL's password (`redacted`), whoever built it."""

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
    flavour: Literal["open", "proprietary"] | None = None
    """Format 2 packages: which kernel module tree they hold; None for format 1."""
    parameters: dict[str, dict[str, str]] | None = None
    """The parameters its modules declare, module to `{name: modinfo type}`, as the packager
    read them (`gpuop upgrade start` checks the policy's against them); None: not listed."""


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
        """The parsed `index.json`, once its signature is checked (`verifying`)."""
        ...

    async def fetch(self, entry: IndexEntry, destination: Path) -> Fetched:
        """Copy `entry`'s archive to `destination`, hashing what was written."""
        ...


def open_source(
    source: dm.DriverSource,
    *,
    connect_timeout: float,
    read_timeout: float,
    max_bytes: int,
    signed_after: float | None = None,
) -> DriverSource:
    """The source `source.uri` names, checking its index with `source`'s keys (and its
    signing time against `signed_after`, see `verifying.check_index`);
    `SourceError(not-found)` when it names no kind we read."""
    uri = source.uri
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        return HttpSource(uri, source, connect_timeout, read_timeout, max_bytes, signed_after)
    if scheme == "file":
        path = Path(unquote(urlsplit(uri).path))
        return DirectorySource(path, source, max_bytes, signed_after)
    if scheme == "" and uri.startswith("/"):
        return DirectorySource(Path(uri), source, max_bytes, signed_after)
    raise SourceError(
        InstallFailureReason.NOT_FOUND,
        f"driver source {uri!r} is neither an absolute directory path nor an http(s) URL",
    )


def select(
    index: SourceIndex,
    uri: str,
    component: str,
    version: str,
    kernel_release: str,
    flavour: str | None = None,
) -> IndexEntry:
    """The package of `component` `version` built for `kernel_release`, of `flavour` when
    one is asked for (else the first the index lists for that kernel: format 1 and 2
    packages mix in one source); `SourceError` (not-found) naming what the source has
    instead. A format-1 entry names no flavour (its modules are the simulation's stand-ins,
    which the simulated kernel loads as the recorded host's open modules): it serves either
    flavour when the source has no format-2 package of the one asked for."""
    same = [e for e in index.packages if e.component == component and e.version == version]
    built = [e for e in same if e.kernel_release == kernel_release]
    for entry in built:
        if flavour is None or entry.flavour == flavour:
            return entry
    if flavour is not None:
        for entry in built:
            if entry.flavour is None:
                return entry
    if built:
        flavours = ", ".join(flavours_for(index, component, version, kernel_release))
        detail = f"no {flavour} build for kernel {kernel_release} (it has: {flavours})"
    elif same:
        kernels = ", ".join(sorted({entry.kernel_release for entry in same}))
        detail = f"no build for kernel {kernel_release} (it has builds for: {kernels})"
    else:
        versions = sorted({e.version for e in index.packages if e.component == component})
        detail = f"no such version (it has: {', '.join(versions) or 'none'})"
    raise SourceError(
        InstallFailureReason.NOT_FOUND,
        f"driver source {uri} has no {component} {version} package: {detail}",
    )


def flavours_for(
    index: SourceIndex, component: str, version: str, kernel_release: str
) -> tuple[str, ...]:
    """The kernel module flavours the index has `component` `version` in for
    `kernel_release`, sorted, a format-1 package named as such; () for no build at all."""
    return tuple(
        sorted(
            {
                _flavour_name(e)
                for e in index.packages
                if (e.component, e.version, e.kernel_release)
                == (component, version, kernel_release)
            }
        )
    )


def _flavour_name(entry: IndexEntry) -> str:
    return entry.flavour or "format 1 (no flavour)"


def _parse_index(
    data: bytes,
    signature: bytes | None,
    uri: str,
    trust: dm.DriverSource,
    plain_http: bool,
    signed_after: float | None,
) -> SourceIndex:
    """The index `data`, once `verifying` found its `signature` good under `trust`."""
    try:
        verifying.check_index(
            data, signature, redacted(uri), trust, plain_http=plain_http, signed_after=signed_after
        )
    except verifying.UntrustedIndex as exc:
        raise SourceError(InstallFailureReason.VERIFICATION_FAILED, str(exc)) from None
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

    def __init__(
        self,
        directory: Path,
        trust: dm.DriverSource,
        max_bytes: int,
        signed_after: float | None = None,
    ) -> None:
        self.directory = directory
        self.trust = trust
        self.max_bytes = max_bytes
        self.signed_after = signed_after

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
        signature_path = self.directory / verifying.SIGNATURE
        signature: bytes | None
        try:
            signature = await asyncio.to_thread(
                _read_limited, signature_path, verifying.MAX_SIGNATURE_BYTES
            )
        except FileNotFoundError:
            signature = None
        except OSError as exc:
            raise SourceError(
                InstallFailureReason.SOURCE_UNREACHABLE, f"cannot read {signature_path}: {exc}"
            ) from None
        return _parse_index(data, signature, self.uri, self.trust, False, self.signed_after)

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

    def __init__(
        self,
        url: str,
        trust: dm.DriverSource,
        connect: float,
        read: float,
        max_bytes: int,
        signed_after: float | None = None,
    ) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self.trust = trust
        self.signed_after = signed_after
        self.connect, self.read = connect, read
        self.max_bytes = max_bytes
        self.secure = urlsplit(url).scheme.lower() == "https"
        self._context: ssl.SSLContext | None = None

    @property
    def uri(self) -> str:
        return self.url

    async def index(self) -> SourceIndex:
        url = urljoin(self.url, packaging.INDEX)
        chunks: list[bytes] = []
        await self._get(url, chunks.append, MAX_INDEX_BYTES)
        signature_chunks: list[bytes] = []
        signature: bytes | None = None
        try:
            await self._get(
                urljoin(self.url, verifying.SIGNATURE),
                signature_chunks.append,
                verifying.MAX_SIGNATURE_BYTES,
            )
            signature = b"".join(signature_chunks)
        except SourceError as exc:
            if exc.reason is not InstallFailureReason.NOT_FOUND:
                raise
        # a redirect off https is refused in `_get`, so only the source's own scheme counts
        plain = not self.secure
        data = b"".join(chunks)
        return _parse_index(data, signature, url, self.trust, plain, self.signed_after)

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
        context = await self._ssl_context()
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout, trust_env=True) as session,
                session.get(url, ssl=context if context is not None else True) as response,
            ):
                hops = [hop.url for hop in (*response.history, response)]
                if self.secure and any(hop.scheme != "https" for hop in hops):
                    insecure = next(hop for hop in hops if hop.scheme != "https")
                    raise SourceError(
                        InstallFailureReason.VERIFICATION_FAILED,
                        f"{url}: redirected from https to {insecure}; refusing to leave https",
                    )
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

    async def _ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a source with its own CA bundle (built once); None: aiohttp's
        default, the node's trust store."""
        bundle = self.trust.ca_bundle
        if bundle is None or not self.secure:
            return None
        if self._context is None:
            self._context = await asyncio.to_thread(_context_trusting, bundle, self.url)
        return self._context


def _context_trusting(bundle: str, uri: str) -> ssl.SSLContext:
    """A verifying TLS client context that trusts the certificates of `bundle` (PEM text, or
    a path to a PEM file) and nothing else."""
    try:
        if bundle.lstrip().startswith("-----BEGIN "):
            return ssl.create_default_context(cadata=bundle)
        return ssl.create_default_context(cafile=bundle)
    except FileNotFoundError:
        raise SourceError(
            InstallFailureReason.SOURCE_UNREACHABLE,
            f"{uri}: the CA bundle {bundle} does not exist on the node (not mounted?)",
        ) from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise SourceError(
            InstallFailureReason.OTHER, f"{uri}: the source's CA bundle is unusable: {exc}"
        ) from None


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
