"""gpuop's XID catalog: what each NVIDIA XID asks of the operator, kept as data.

The catalog is `xids.json`, shipped in this package and read with `importlib.resources`.
It is NVIDIA's published XID catalog (docs.nvidia.com/deploy/xid-errors, the Ampere+
`Xid-Catalog.xlsx`), transcribed with its sources, the date it was compiled, the upstream
snapshot it follows and a `version` bumped on every change. For each XID it keeps the
mnemonic, the description (`name`), NVIDIA's immediate resolution bucket, and the
`XidAction` gpuop takes: the bucket's action (the file's `buckets` table), unless the entry
names an `action` of its own and its `note` says why gpuop differs (XID 63: a pending row
remap needs a reset before telemetry can call the GPU recovered).

An XID the catalog does not list gets the file's `default` (`reset-gpu`, and why): it marks
the GPU unhealthy as the NVIDIA device plugin does for any XID it does not know, and a reset
is the least disruptive step that can clear it.

Telemetry alone consults the catalog (it owns the health decision) and publishes the action
on `device.health-changed`; the catalog is loaded once per process (`packaged()`). A
catalog that does not validate fails the load with `CatalogError` naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from functools import cache
from importlib import resources
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuop.events import documents
from gpuop.events.device import XidAction

CATALOG_FILE = "xids.json"
FORMAT = 1
"""The layout of the file this module reads; a file of another format is refused."""

Xid = Annotated[int, Field(ge=0, le=65535)]
Text = Annotated[str, Field(min_length=1, max_length=1024)]


class CatalogError(ValueError):
    """The XID catalog is malformed; the message names the entry and what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class _Entry(_Strict):
    xid: Xid
    mnemonic: Annotated[str, Field(pattern=r"^[A-Z0-9_]+$", max_length=128)]
    name: Text
    bucket: Annotated[str, Field(pattern=r"^[A-Z0-9_]+$", max_length=128)]
    action: Annotated[XidAction, Field(strict=False)] | None = None
    note: Text | None = None


class _Default(_Strict):
    action: Annotated[XidAction, Field(strict=False)]
    why: Text


class CatalogHeader(_Strict):
    """What every file of the health catalog opens with (this one and `signals.json`)."""

    format: int
    version: Annotated[int, Field(ge=1)]
    date: Annotated[date, Field(strict=False)]
    sources: Annotated[tuple[Text, ...], Field(min_length=1, strict=False)]
    about: Text


class _Header(CatalogHeader):
    upstream_snapshot: Text
    default: _Default
    buckets: Mapping[str, Annotated[XidAction, Field(strict=False)]]
    xids: Annotated[tuple[Any, ...], Field(min_length=1, strict=False)]


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One XID of the catalog."""

    xid: int
    mnemonic: str
    name: str
    bucket: str
    """NVIDIA's immediate resolution bucket (`RESET_GPU`, `RESTART_APP`, ...)."""
    action: XidAction
    """What gpuop does: the bucket's action, or the entry's own."""
    note: str | None = None


@dataclass(frozen=True, slots=True)
class XidCatalog:
    """The catalog as loaded: entries by XID, and the action for any other XID."""

    version: int
    date: date
    upstream_snapshot: str
    sources: tuple[str, ...]
    default: XidAction
    entries: Mapping[int, XidEntry]

    def action(self, xid: int) -> XidAction:
        """What `xid` asks for; the default for an XID the catalog does not list."""
        entry = self.entries.get(xid)
        return entry.action if entry is not None else self.default

    def describe(self, xid: int) -> str:
        """`XID 79 (GPU has fallen off the bus)`, or `XID 999 (not in the catalog)`."""
        entry = self.entries.get(xid)
        return f"XID {xid} ({entry.name if entry is not None else 'not in the catalog'})"


def parse(text: str, *, origin: str = CATALOG_FILE) -> XidCatalog:
    """The catalog in `text` (the JSON of `xids.json`); `origin` names it in errors."""
    header = validated(text, origin, FORMAT, _Header)
    entries: dict[int, XidEntry] = {}
    for position, raw in enumerate(header.xids):
        entry = _entry(raw, position, header.buckets, origin)
        if entry.xid in entries:
            raise CatalogError(f"{origin}: {_where(position, raw)}: XID {entry.xid} listed twice")
        entries[entry.xid] = entry
    return XidCatalog(
        version=header.version,
        date=header.date,
        upstream_snapshot=header.upstream_snapshot,
        sources=header.sources,
        default=header.default.action,
        entries=entries,
    )


@cache
def packaged() -> XidCatalog:
    """The catalog shipped with gpuop, loaded once."""
    text = resources.files(__package__).joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    return parse(text, origin=f"{__package__}/{CATALOG_FILE}")


M = TypeVar("M", bound=BaseModel)


def validated(text: str, origin: str, format: int, model: type[M]) -> M:
    """A catalog file's JSON `text` as `model`, refused unless its `format` is `format`;
    every problem a `CatalogError` naming `origin` (the health catalog's files share it)."""
    try:
        document = documents.json_object(text)
    except ValueError as error:
        raise CatalogError(f"{origin}: {error}") from error
    if document.get("format") != format:
        raise CatalogError(
            f"{origin}: format {document.get('format')!r} is not the one this gpuop reads"
            f" ({format})"
        )
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise CatalogError(f"{origin}: {validation_message(error)}") from error


def _entry(raw: Any, position: int, buckets: Mapping[str, XidAction], origin: str) -> XidEntry:
    try:
        entry = _Entry.model_validate(raw)
    except ValidationError as error:
        where = _where(position, raw)
        raise CatalogError(f"{origin}: {where}: {validation_message(error)}") from error
    action = entry.action or buckets.get(entry.bucket)
    if action is None:
        raise CatalogError(
            f"{origin}: {_where(position, raw)}: bucket {entry.bucket!r} is not in the buckets"
            " table and the entry names no action"
        )
    return XidEntry(entry.xid, entry.mnemonic, entry.name, entry.bucket, action, entry.note)


def _where(position: int, raw: Any) -> str:
    xid = raw.get("xid") if isinstance(raw, dict) else None
    return f"xids[{position}]" + (f" (XID {xid})" if xid is not None else "")


def validation_message(error: ValidationError) -> str:
    """The first problem pydantic found, as `field: message`."""
    detail = error.errors()[0]
    field = ".".join(str(part) for part in detail["loc"])
    return f"{field}: {detail['msg']}" if field else detail["msg"]
