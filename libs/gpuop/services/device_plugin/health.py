"""Which GPUs are unhealthy, from the `device.health-changed` events telemetry publishes.

`HealthBook` is applied by `plugins.DevicePlugins` to every event of this node, in stream
order (restored from the log at start, then live). Health is per physical GPU: its MIG
devices and time-sliced replicas share it.

    XID in `ignoredXids` (13, 31, 43, 45, 68, 109)   an application error: stays healthy
    any other XID, uncorrectable ECC, unreachable     Unhealthy
    a recovery reported by telemetry                  noted, but the GPU stays Unhealthy
    the driver-manager validated a (re)loaded driver  every GPU Healthy again (`reset`)

Upstream never makes a device healthy again short of a plugin restart; gpuop does, but only
once a driver reload was validated, not on the word of one event: a GPU that threw a
critical XID needs a reset before work should land on it again.
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
            if uuid in self._unhealthy:
                log.info(
                    "%s reported recovered; it stays unhealthy until a driver reload validates it",
                    uuid,
                )
            return False
        if event.reason is device.HealthReason.XID and ignores(self.ignored_xids, event.xid):
            log.info("%s: XID %s is an application error; the GPU stays healthy", uuid, event.xid)
            return False
        if uuid in self._unhealthy:
            return False
        self._unhealthy[uuid] = _why(event)
        log.warning("%s is unhealthy: %s", uuid, self._unhealthy[uuid])
        return True

    def reset(self) -> list[str]:
        """Every GPU healthy again (a validated driver reload); the ones that were not."""
        recovered = sorted(self._unhealthy)
        self._unhealthy.clear()
        if recovered:
            log.info("healthy again after a validated driver reload: %s", ", ".join(recovered))
        return recovered


def _why(event: device.DeviceHealthChanged) -> str:
    reason = f"XID {event.xid}" if event.reason is device.HealthReason.XID else str(event.reason)
    return f"{reason}: {event.message}" if event.message else reason
