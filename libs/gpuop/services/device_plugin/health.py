"""Which GPUs are unhealthy, from the `device.health-changed` events telemetry publishes.

`HealthBook` is applied by `plugins.DevicePlugins` to every event of this node, in stream
order (restored from the log at start, then live). Health is per physical GPU: its MIG
devices and time-sliced replicas share it.

    XID in `ignoredXids` (13, 31, 43, 45, 68, 109)   an application error: stays healthy
    any other XID, uncorrectable ECC, unreachable     Unhealthy
    a `mark` (heat, power, a slower link)             Unhealthy while it lasts
    a recovery reported by telemetry                  Healthy after marks alone; after
                                                      anything else noted, but the GPU
                                                      stays Unhealthy
    the driver-manager validated a (re)loaded driver  every GPU Healthy again (`reset`)

Upstream never makes a device healthy again short of a plugin restart; gpuop does, but only
once a driver reload was validated, not on the word of one event: a GPU that threw a
critical XID needs a reset before work should land on it again. A GPU that only ever asked
to be marked (action `mark`: nothing to remediate) is Healthy again when telemetry says its
condition ended.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpuop.events import device
from gpuop.health import ignores

log = logging.getLogger(__name__)


class HealthBook:
    """The unhealthy GPUs of one node, and why."""

    def __init__(self, ignored_xids: Iterable[int]) -> None:
        self.ignored_xids = frozenset(ignored_xids)
        self._unhealthy: dict[str, str] = {}
        self._marked_only: set[str] = set()
        """Unhealthy GPUs whose every fault asked for `mark` alone."""

    @property
    def unhealthy(self) -> dict[str, str]:
        """Why each unhealthy GPU is, by UUID."""
        return dict(self._unhealthy)

    def is_healthy(self, gpu_uuid: str) -> bool:
        return gpu_uuid not in self._unhealthy

    def apply(self, event: device.DeviceHealthChanged) -> bool:
        """Take one event into account; whether a GPU's health changed."""
        uuid = event.gpu_uuid
        if event.healthy:
            if uuid in self._marked_only:
                self._marked_only.discard(uuid)
                del self._unhealthy[uuid]
                log.info("%s: the condition it was marked for ended; healthy again", uuid)
                return True
            if uuid in self._unhealthy:
                log.info(
                    "%s reported recovered; it stays unhealthy until a driver reload validates it",
                    uuid,
                )
            return False
        if event.reason is device.HealthReason.XID and ignores(self.ignored_xids, event.xid):
            log.info("%s: XID %s is an application error; the GPU stays healthy", uuid, event.xid)
            return False
        marks_only = event.effective_action is device.XidAction.MARK
        if uuid in self._unhealthy:
            if not marks_only:
                self._marked_only.discard(uuid)
            return False
        if marks_only:
            self._marked_only.add(uuid)
        self._unhealthy[uuid] = _why(event)
        log.warning("%s is unhealthy: %s", uuid, self._unhealthy[uuid])
        return True

    def reset(self) -> list[str]:
        """Every GPU healthy again (a validated driver reload); the ones that were not."""
        recovered = sorted(self._unhealthy)
        self._unhealthy.clear()
        self._marked_only.clear()
        if recovered:
            log.info("healthy again after a validated driver reload: %s", ", ".join(recovered))
        return recovered


def _why(event: device.DeviceHealthChanged) -> str:
    reason = f"XID {event.xid}" if event.reason is device.HealthReason.XID else str(event.reason)
    return f"{reason}: {event.message}" if event.message else reason
