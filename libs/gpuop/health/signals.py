"""gpuop's health catalog: every GPU health signal, mapped to an action with a reason.

One catalog decides every signal telemetry reads on a node. An XID, whether NVML's event
or the kernel log's `NVRM: Xid` line brought it, is decided by the XID catalog
(`gpuop.health.xids`, `xids.json`); every other signal by `signals.json`, shipped beside it:
NVLink error counters, clock event reasons held past a time, PCIe replays and link
width/generation drops, row-remap pending and failure, a GPU lost from the bus
(`NVML_ERROR_GPU_IS_LOST`) or otherwise unreachable, uncorrectable ECC errors. `Catalog`
joins the two: `for_xid` and `for_signal` give a `Verdict`, the action (ignore is `none`,
then `mark`, `reset-gpu`, `reboot`, `drain-and-replace`) and the reason, and telemetry
puts both on the `device.health-changed` it publishes.

A signal entry is data: its NVML source, its kind (an `event`, a `counter` that fires when
its fields rise by `count` within `window_seconds`, a `condition` that fires when it holds
for `held_seconds`), whether its mark `clears` with the condition, its action and why.
`gpuop.health.detecting` applies the thresholds to NVML's readings. A file that does not
validate fails the load with `CatalogError` naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuop.events.device import XidAction
from gpuop.health import xids
from gpuop.health.xids import CatalogError

CATALOG_FILE = "signals.json"
FORMAT = 1
"""The layout of the file this module reads; a file of another format is refused."""
XID = "xid"
"""The signal name of an XID, decided by the XID catalog."""

Text = Annotated[str, Field(min_length=1, max_length=1024)]
Seconds = Annotated[float, Field(ge=0, le=86_400, strict=False)]


class SignalEntry(BaseModel):
    """One signal of the catalog."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    signal: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    """Its name, carried as the event's `signal`."""
    source: Text
    """Where NVML gives it (the call, field ids or bits), for the reader."""
    kind: Literal["event", "counter", "condition"]
    fields: tuple[Annotated[int, Field(ge=0)], ...] = Field(default=(), strict=False)
    """`nvmlFieldValue` ids summed for a counter read from the batched field query."""
    bits: tuple[Annotated[int, Field(gt=0)], ...] = Field(default=(), strict=False)
    """`nvmlClocksEventReason` bits, any of which makes the condition hold."""
    count: Annotated[int, Field(ge=1)] | None = None
    window_seconds: Seconds | None = None
    held_seconds: Seconds | None = None
    clears: bool = False
    """The mark lifts when the condition does; otherwise it holds until the GPU answers
    after a reset or reboot (a new NVML session) with the condition gone."""
    action: Annotated[XidAction, Field(strict=False)]
    why: Text


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a signal asks for, and why."""

    signal: str
    """The catalog's name of the signal (`xid` for any XID)."""
    action: XidAction
    """What gpuop does about it."""
    why: str
    """The catalog's reason, for the event's message."""


@dataclass(frozen=True, slots=True)
class Catalog:
    """The XID catalog and the signal catalog, as one."""

    version: int
    signals: Mapping[str, SignalEntry]
    xids: xids.XidCatalog

    def for_signal(self, name: str) -> Verdict:
        """What the signal `name` asks for; `KeyError` for a name the catalog lacks (a
        programming error: detectors only make the signals the catalog lists)."""
        entry = self.signals[name]
        return Verdict(entry.signal, entry.action, entry.why)

    def for_xid(self, xid: int) -> Verdict:
        """What `xid` asks for, from the XID catalog, with its description as the reason."""
        entry = self.xids.entries.get(xid)
        why = self.xids.describe(xid)
        if entry is not None and entry.note:
            why = f"{why}: {entry.note}"
        return Verdict(XID, self.xids.action(xid), why)

    def fields(self) -> tuple[int, ...]:
        """Every `nvmlFieldValue` id the signals read, once each, in catalog order."""
        return tuple(dict.fromkeys(f for entry in self.signals.values() for f in entry.fields))

    def clears(self, name: str) -> bool:
        """Whether the mark of signal `name` lifts with its condition."""
        entry = self.signals.get(name)
        return entry is not None and entry.clears


REQUIRED: Mapping[str, tuple[str, ...]] = {
    "counter": ("count", "window_seconds"),
    "condition": ("held_seconds",),
    "event": (),
}


class _File(xids.CatalogHeader):
    signals: Annotated[tuple[Any, ...], Field(min_length=1, strict=False)]


def parse(text: str, *, origin: str = CATALOG_FILE, xid_catalog: xids.XidCatalog) -> Catalog:
    """The catalog in `text` (the JSON of `signals.json`) joined with `xid_catalog`."""
    header = xids.validated(text, origin, FORMAT, _File)
    entries: dict[str, SignalEntry] = {}
    for position, raw in enumerate(header.signals):
        where = f"{origin}: signals[{position}]"
        try:
            entry = SignalEntry.model_validate(raw)
        except ValidationError as error:
            raise CatalogError(f"{where}: {xids.validation_message(error)}") from error
        missing = [key for key in REQUIRED[entry.kind] if getattr(entry, key) is None]
        if missing:
            raise CatalogError(f"{where} ({entry.signal}): a {entry.kind} needs {missing}")
        if entry.signal == XID or entry.signal in entries:
            raise CatalogError(f"{where}: signal {entry.signal!r} listed twice")
        entries[entry.signal] = entry
    return Catalog(version=header.version, signals=entries, xids=xid_catalog)


@cache
def packaged() -> Catalog:
    """The catalog shipped with gpuop, loaded once."""
    text = resources.files(__package__).joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    return parse(text, origin=f"{__package__}/{CATALOG_FILE}", xid_catalog=xids.packaged())
