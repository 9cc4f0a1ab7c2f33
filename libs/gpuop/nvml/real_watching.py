"""XID and ECC events from a real driver: an NVML event set, for `PynvmlBackend`.

Registers each watched GPU for the event types it supports among XID critical errors and
single- and double-bit ECC errors, then turns `nvmlEventSetWait_v2` answers into
`XidEvent` and `EccEvent`. A wait holds a lock for its whole (C-side, blocking) duration, so
`close()` from another thread frees the event set only once that wait returned.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpuop.nvml.binding import Binding, text
from gpuop.nvml.errors import NotInitialized, NvmlError, NvmlTimeout
from gpuop.nvml.watching import DeviceEvent, EccEvent, XidEvent, instance_id

SINGLE_BIT_ECC = 0x1
"""`nvmlEventTypeSingleBitEccError`."""
DOUBLE_BIT_ECC = 0x2
"""`nvmlEventTypeDoubleBitEccError`."""
XID_CRITICAL = 0x8
"""`nvmlEventTypeXidCriticalError`."""
WATCHED = SINGLE_BIT_ECC | DOUBLE_BIT_ECC | XID_CRITICAL


class PynvmlEventWatcher:
    """One NVML event set registered on some GPUs."""

    def __init__(
        self,
        nvml: Binding,
        handles: Mapping[int, Any],
        uuids: Mapping[str, int],
        on_close: Callable[[PynvmlEventWatcher], None],
    ) -> None:
        self._nvml = nvml
        self._uuids = dict(uuids)
        self._on_close = on_close
        self._lock = threading.Lock()
        self._set: Any = nvml.call("nvmlEventSetCreate")
        try:
            for handle in handles.values():
                supported = nvml.optional("nvmlDeviceGetSupportedEventTypes", handle) or 0
                if wanted := WATCHED & int(supported):
                    nvml.call("nvmlDeviceRegisterEvents", handle, wanted, self._set)
        except NvmlError:
            self._free()
            raise

    def wait(self, timeout_ms: int) -> DeviceEvent | None:
        with self._lock:
            if self._set is None:
                raise NotInitialized("the event watcher is closed")
            try:
                data = self._nvml.call("nvmlEventSetWait_v2", self._set, timeout_ms)
            except NvmlTimeout:
                return None
            uuid = text(self._nvml.call("nvmlDeviceGetUUID", data.device))
        index = self._uuids.get(uuid, -1)
        kind = int(data.eventType)
        if kind & XID_CRITICAL:
            return XidEvent(
                index=index,
                uuid=uuid,
                xid=int(data.eventData),
                gpu_instance_id=instance_id(int(data.gpuInstanceId)),
                compute_instance_id=instance_id(int(data.computeInstanceId)),
            )
        if kind & (SINGLE_BIT_ECC | DOUBLE_BIT_ECC):
            return EccEvent(index=index, uuid=uuid, uncorrectable=bool(kind & DOUBLE_BIT_ECC))
        return None  # only the types above are registered; anything else is not ours

    def close(self) -> None:
        with self._lock:
            if self._set is None:
                return
            self._free()
        self._on_close(self)

    def _free(self) -> None:
        event_set, self._set = self._set, None
        # Freeing fails only when the session is already gone, which freed the set too.
        with contextlib.suppress(NvmlError):
            self._nvml.call("nvmlEventSetFree", event_set)
