"""Which GPUs are marked unhealthy, and what each asks for: telemetry's health decision,
made from NVML's events, the kernel log's XIDs and every fast collection (the node exporter
hands them over) and published as `device.health-changed`.

`HealthTracker` decides what changed and what the fault asks for from gpuop's health
catalog (`gpuop.health.signals`: the XID catalog and the signal catalog as one), and every
event it makes carries that `XidAction`, the signal's name and the catalog's reason:

- an XID gets the action the XID catalog gives it. An action of `none` or
  `restart-application` (the XIDs an application causes, or informational ones) keeps the
  GPU healthy and only shows in the metrics; any other makes the GPU unhealthy (reason
  `xid`). An XID in `ignored_xids` never changes health, whatever the catalog says: an
  explicit ignore list wins. Its default is the NVIDIA device plugin's list, so XID 109,
  which the catalog resets, stays ignored as upstream ignores it; `ignored_xids: []` leaves
  the decision to the catalog alone;
- an uncorrectable ECC event is the catalog's `ecc-uncorrectable` (`reset-gpu`: a reset
  retires the bad page, or applies the row remap it left pending), with the counters of the
  collection that followed; corrected errors only count in the metrics;
- every fast collection goes through `gpuop.health.detecting` with the last slow round's
  field values: NVLink error storms, clocks held down, PCIe replays and link drops, row
  remaps pending or failed, each with the catalog's action (`mark` keeps the GPU out of
  service while it lasts and remediates nothing);
- a GPU the fast queries cannot reach is `gpu-lost` (`NVML_ERROR_GPU_IS_LOST`) or
  `gpu-unreachable`, reason `unreachable`, action `reboot` (a reset goes through the driver
  to a GPU it can reach, as the catalog's `RESTART_BM` for XID 79) until it answers again;
  a GPU that falls off the bus (79, or lost) in a later boot than an earlier fall is
  `gpu-lost-again`: `drain-and-replace` (`gpuop.health.falls` remembers across reboots);
- while a GPU is unhealthy, a further fault never lowers the action: each event carries the
  strongest action the GPU's mark has seen (`reboot` after 79 stays `reboot` on a later 48),
  and a signal that asks no more than the mark already does makes no event (the kernel
  log's 79 and NVML's `GPU_IS_LOST` are one fault);
- a mark whose signal `clears` (the catalog says) lifts when its condition ends; an XID, ECC
  or other mark holds until the GPU answers in a later NVML session (after the driver
  reload a pause and resume bring, or a reset) with no signal firing, no uncorrected
  volatile ECC error nor pending row remap; then the GPU is `recovered` (action `none`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from gpuop.events.device import DeviceHealthChanged, HealthReason, XidAction
from gpuop.health import detecting, falls, ignores, kmsg, signals, xids
from gpuop.nvml import DeviceEvent, DeviceMetrics, EccEvent, XidEvent
from gpuop.services.telemetry.collecting import FastRound
from gpuop.services.telemetry.sessions import Inventory

MAX_EVENT_COUNT = 1_000_000
"""The most an event's ECC counts carry (`fields.Count`)."""


GPU_LOST_AGAIN = "gpu-lost-again"
"""A GPU that fell off the bus in an earlier boot too (`gpuop.health.falls`)."""
REASONS: Mapping[str, HealthReason] = {
    signals.XID: HealthReason.XID,
    "ecc-uncorrectable": HealthReason.ECC,
    "nvlink-errors": HealthReason.NVLINK,
    "clocks-thermal": HealthReason.CLOCKS,
    "clocks-power-brake": HealthReason.CLOCKS,
    "pcie-replays": HealthReason.PCIE,
    "pcie-link-width": HealthReason.PCIE,
    "pcie-link-generation": HealthReason.PCIE,
    "row-remap-pending": HealthReason.ROW_REMAP,
    "row-remap-failure": HealthReason.ROW_REMAP,
    detecting.GPU_LOST: HealthReason.UNREACHABLE,
    GPU_LOST_AGAIN: HealthReason.UNREACHABLE,
    detecting.GPU_UNREACHABLE: HealthReason.UNREACHABLE,
}
"""The event's `reason` for each signal of the health catalog."""


@dataclass(frozen=True, slots=True)
class _Mark:
    reason: HealthReason
    session: Inventory
    """The NVML session in which the GPU became unhealthy."""
    action: XidAction
    """The strongest action the faults since then asked for."""
    signal: str
    """The health catalog's signal that asked for `action`."""


class HealthTracker:
    """Decides when a GPU's health changed and what it asks for; see the module docstring."""

    def __init__(
        self,
        ignored_xids: Collection[int],
        catalog: xids.XidCatalog | None = None,
        *,
        health_catalog: signals.Catalog | None = None,
        fallen: falls.Falls | None = None,
    ) -> None:
        self._ignored = frozenset(ignored_xids)
        self._falls = fallen
        self._signals = health_catalog or signals.packaged()
        if catalog is not None:
            self._signals = replace(self._signals, xids=catalog)
        self._catalog = self._signals.xids
        self.detector = detecting.Detector(self._signals)
        self._marks: dict[str, _Mark] = {}

    def unhealthy(self) -> dict[str, HealthReason]:
        """The GPUs marked unhealthy now, by UUID."""
        return {uuid: mark.reason for uuid, mark in self._marks.items()}

    def actions(self) -> dict[str, XidAction]:
        """What each GPU marked unhealthy now asks for, by UUID."""
        return {uuid: mark.action for uuid, mark in self._marks.items()}

    def xid_action(self, xid: int) -> XidAction | None:
        """What `xid` asks for; None when `ignored_xids` lists it."""
        return None if ignores(self._ignored, xid) else self._catalog.action(xid)

    def _mark(self, uuid: str, session: Inventory, verdict: signals.Verdict) -> XidAction:
        """Mark the GPU unhealthy; returns the action it now asks for, never lower than
        what its current mark asked (a stronger mark keeps its own signal, so a weaker
        signal's clearing never lifts it)."""
        previous = self._marks.get(uuid)
        if previous is not None and previous.action.rank > verdict.action.rank:
            return previous.action
        reason = REASONS[verdict.signal]
        self._marks[uuid] = _Mark(reason, session, verdict.action, verdict.signal)
        return verdict.action

    def on_event(
        self, event: DeviceEvent, session: Inventory, last: FastRound | None
    ) -> DeviceHealthChanged | None:
        """The health change an NVML event means, if any; `last` is the collection that
        followed it."""
        if isinstance(event, XidEvent):
            if self.xid_action(event.xid) is None:
                return None
            verdict = self._signals.for_xid(event.xid)
            if verdict.action.keeps_gpu_healthy:
                return None
            if event.xid == kmsg.FALLEN_OFF_BUS_XID:
                verdict = self._fell(event.uuid, verdict)
            action = self._mark(event.uuid, session, verdict)
            again = (
                f", again after a reboot: {verdict.why}" if verdict.signal != signals.XID else ""
            )
            return DeviceHealthChanged(
                gpu_uuid=event.uuid,
                healthy=False,
                reason=HealthReason.XID,
                xid=event.xid,
                action=action,
                signal=verdict.signal,
                message=(
                    f"{self._catalog.describe(event.xid)} on GPU {event.index}: {action}{again}"
                )[:1024],
            )
        if isinstance(event, EccEvent) and event.uncorrectable:
            metrics = last.metrics.get(event.index) if last else None
            verdict = self._signals.for_signal("ecc-uncorrectable")
            action = self._mark(event.uuid, session, verdict)
            pending = " (row remap pending)" if metrics and metrics.remapped_rows_pending else ""
            return DeviceHealthChanged(
                gpu_uuid=event.uuid,
                healthy=False,
                reason=HealthReason.ECC,
                signal=verdict.signal,
                ecc_volatile_uncorrected=_count(
                    metrics.ecc_volatile_uncorrected if metrics else None
                ),
                ecc_aggregate_uncorrected=_count(
                    metrics.ecc_aggregate_uncorrected if metrics else None
                ),
                action=action,
                message=f"uncorrectable ECC error on GPU {event.index}{pending}: {action}",
            )
        return None

    def on_round(
        self,
        session: Inventory,
        collected: FastRound,
        *,
        fields: Mapping[int, detecting.Fields] | None = None,
        now: float = 0.0,
    ) -> list[DeviceHealthChanged]:
        """The health changes one fast collection shows: the signals of the health catalog
        that fire with it (`fields`: the latest slow field values by GPU index; `now`: the
        monotonic time of the round), GPUs lost, GPUs back."""
        changes: list[DeviceHealthChanged] = []
        for gpu in session.gpus:
            error = collected.failures.get(gpu.index)
            if error is not None:
                mark = self._marks.get(gpu.uuid)
                if mark is None or mark.reason is not HealthReason.UNREACHABLE:
                    lost = self.detector.lost(gpu.index, gpu.uuid, error)
                    changes.extend(self._detected(lost, session))
                continue
            metrics = collected.metrics.get(gpu.index)
            if metrics is None:
                continue
            seen = (fields or {}).get(gpu.index, {})
            for detection in self.detector.observe(gpu.index, gpu.uuid, metrics, seen, now):
                changes.extend(self._detected(detection, session))
            mark = self._marks.get(gpu.uuid)
            active = self.detector.active(gpu.uuid)
            if mark is not None and self._recovered(mark, session, metrics, active):
                del self._marks[gpu.uuid]
                changes.append(
                    DeviceHealthChanged(
                        gpu_uuid=gpu.uuid,
                        healthy=True,
                        reason=HealthReason.RECOVERED,
                        action=XidAction.NONE,
                        ecc_volatile_uncorrected=_count(metrics.ecc_volatile_uncorrected),
                        ecc_aggregate_uncorrected=_count(metrics.ecc_aggregate_uncorrected),
                        message=f"GPU {gpu.index} answers again after {mark.reason}",
                    )
                )
        return changes

    def _detected(
        self, detection: detecting.Detection, session: Inventory
    ) -> list[DeviceHealthChanged]:
        """The event a signal makes: none when the catalog ignores it, or when the GPU's
        mark already asks as much (the same fault seen by a second source, such as the
        kernel log's XID 79 and NVML's GPU_IS_LOST, is one event)."""
        verdict = self._signals.for_signal(detection.signal)
        mark = self._marks.get(detection.uuid)
        if detection.signal == detecting.GPU_LOST and mark is None:
            verdict = self._fell(detection.uuid, verdict)
        if verdict.action.keeps_gpu_healthy or (
            mark is not None and mark.action.rank >= verdict.action.rank
        ):
            return []
        action = self._mark(detection.uuid, session, verdict)
        message = f"{detection.detail}: {action}, {verdict.why}"
        return [
            DeviceHealthChanged(
                gpu_uuid=detection.uuid,
                healthy=False,
                reason=REASONS[verdict.signal],
                action=action,
                signal=verdict.signal,
                message=message[:1024],
            )
        ]

    def _fell(self, uuid: str, verdict: signals.Verdict) -> signals.Verdict:
        """A fall off the bus: `gpu-lost-again` when the GPU fell in an earlier boot too."""
        if self._falls is not None and self._falls.again(uuid):
            return self._signals.for_signal(GPU_LOST_AGAIN)
        return verdict

    def _recovered(
        self, mark: _Mark, session: Inventory, metrics: DeviceMetrics, active: frozenset[str]
    ) -> bool:
        if mark.reason is HealthReason.UNREACHABLE:
            return True
        if self._signals.clears(mark.signal):
            return mark.signal not in active  # a mark that remediates nothing lifts with it
        if mark.session is session or active:
            return False  # held until a driver reload, with nothing firing after it
        return not metrics.ecc_volatile_uncorrected and not metrics.remapped_rows_pending


def _count(value: int | None) -> int | None:
    # the event's counts are bounded; a GPU past a million errors is past caring
    return None if value is None else min(value, MAX_EVENT_COUNT)
