"""The ignored XIDs have one home, `gpuop.health`: one default list and one rule, which
telemetry (before it publishes) and the device plugin (on what it receives) both apply."""

from __future__ import annotations

import pytest

from gpuop.events import device
from gpuop.health import APPLICATION_XIDS, ignores
from gpuop.services.device_plugin.config import load_config
from gpuop.services.device_plugin.health import HealthBook
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.marks import HealthTracker

GPU = "GPU-00000000-0000-0000-0000-000000000001"


def test_both_services_default_to_the_one_list() -> None:
    assert TelemetryConfig().ignored_xids is APPLICATION_XIDS
    assert load_config(None).health.ignored_xids is APPLICATION_XIDS


@pytest.mark.parametrize(
    ("ignored", "xid", "expected"),
    [
        (APPLICATION_XIDS, 13, True),
        (APPLICATION_XIDS, 109, True),  # the catalog resets 109; the list wins
        (APPLICATION_XIDS, 79, False),
        ((), 13, False),  # an empty list leaves every XID to the catalog
        ((79,), 79, True),
        (APPLICATION_XIDS, None, False),  # not an XID fault: never ignored
    ],
)
def test_an_xid_on_the_list_is_ignored_by_both_services(
    ignored: tuple[int, ...], xid: int | None, expected: bool
) -> None:
    assert ignores(ignored, xid) is expected
    if xid is None:
        return
    assert (HealthTracker(ignored).xid_action(xid) is None) is expected
    event = device.DeviceHealthChanged(
        gpu_uuid=GPU, healthy=False, reason=device.HealthReason.XID, xid=xid
    )
    assert HealthBook(ignored).apply(event) is not expected
