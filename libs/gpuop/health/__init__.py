"""GPU health rules every node service shares. Telemetry owns the decision: it watches NVML's
XID and ECC events and publishes `device.health-changed`, each with the action gpuop's XID
catalog (`gpuop.health.xids`, the data file `xids.json`) gives it; the device plugin follows
those events (and keeps upstream's `health.ignoredXids` key as a filter of its own).

    APPLICATION_XIDS   the XIDs a faulty application causes, not the GPU: a GPU that
                       reports one stays healthy (the NVIDIA device plugin's default list);
                       the default ignore list of both telemetry (`ignored_xids`) and the
                       device plugin (`health.ignoredXids`)
    ignores            the ignore-list rule both of them apply
    xids               the XID catalog: the action each XID asks for (`XidAction`, whose
                       order is the escalation order)
"""

from __future__ import annotations

from collections.abc import Collection

APPLICATION_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
"""13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
45 preemptive cleanup, 68 video processor exception, 109 context switch timeout."""


def ignores(ignored_xids: Collection[int], xid: int | None) -> bool:
    """Whether an ignore list keeps `xid` from changing a GPU's health, whatever the XID
    catalog says of it (an explicit list wins over the catalog); a fault that is not an XID
    (`None`) is never ignored."""
    return xid is not None and xid in ignored_xids
