"""Telemetry's health decision: each health event carries the action the XID catalog gives;
an application XID keeps the GPU healthy and publishes nothing; an explicit `ignored_xids`
list wins over the catalog; a GPU's action only escalates while it stays unhealthy."""

from __future__ import annotations

from gpuop.events.device import DeviceHealthChanged, HealthReason, XidAction
from gpuop.health import APPLICATION_XIDS, xids
from gpuop.nvml import EccEvent, XidEvent
from gpuop.services.telemetry.marks import HealthTracker
from gpuop.services.telemetry.sessions import Inventory

SESSION = Inventory(driver_version="580.159.04", gpus=(), migs=())
UUID = "GPU-00000000-0000-0000-0000-000000000001"


def _xid(xid: int, index: int = 1, uuid: str = UUID) -> XidEvent:
    return XidEvent(index=index, uuid=uuid, xid=xid, gpu_instance_id=None, compute_instance_id=None)


def test_a_fatal_xid_carries_the_catalogs_action() -> None:
    tracker = HealthTracker(APPLICATION_XIDS)

    event = tracker.on_event(_xid(79), SESSION, None)

    assert isinstance(event, DeviceHealthChanged)
    assert (event.healthy, event.reason, event.xid, event.action) == (
        False,
        HealthReason.XID,
        79,
        XidAction.REBOOT,
    )
    assert tracker.actions() == {UUID: XidAction.REBOOT}


def test_application_xids_change_nothing_even_with_no_ignore_list() -> None:
    tracker = HealthTracker(())

    for xid in (13, 31, 43, 45, 68, 69, 92, 94):
        assert tracker.on_event(_xid(xid), SESSION, None) is None, xid

    assert tracker.unhealthy() == {}


def test_an_explicit_ignore_list_wins_over_the_catalog() -> None:
    ignoring = HealthTracker((48, 109))
    catalog_only = HealthTracker(())

    assert ignoring.on_event(_xid(48), SESSION, None) is None
    assert ignoring.on_event(_xid(109), SESSION, None) is None
    assert ignoring.xid_action(109) is None
    made = catalog_only.on_event(_xid(109), SESSION, None)
    assert made is not None and made.action is XidAction.RESET_GPU


def test_an_unlisted_xid_gets_the_catalogs_default() -> None:
    tracker = HealthTracker(APPLICATION_XIDS)

    event = tracker.on_event(_xid(4242), SESSION, None)

    assert event is not None
    assert event.action is xids.packaged().default is XidAction.RESET_GPU
    assert event.message == "XID 4242 (not in the catalog) on GPU 1: reset-gpu"


def test_a_gpus_action_escalates_and_never_drops_while_it_is_unhealthy() -> None:
    tracker = HealthTracker(APPLICATION_XIDS)

    first = tracker.on_event(_xid(48), SESSION, None)
    worse = tracker.on_event(_xid(79), SESSION, None)
    milder = tracker.on_event(_xid(48), SESSION, None)
    ecc = tracker.on_event(EccEvent(index=1, uuid=UUID, uncorrectable=True), SESSION, None)
    other = tracker.on_event(_xid(48, index=2, uuid=UUID[:-1] + "2"), SESSION, None)

    assert [e.action if e else None for e in (first, worse, milder, ecc, other)] == [
        XidAction.RESET_GPU,
        XidAction.REBOOT,
        XidAction.REBOOT,
        XidAction.REBOOT,
        XidAction.RESET_GPU,
    ]


def test_a_corrected_ecc_error_changes_nothing() -> None:
    tracker = HealthTracker(APPLICATION_XIDS)

    assert (
        tracker.on_event(EccEvent(index=1, uuid=UUID, uncorrectable=False), SESSION, None) is None
    )


def test_a_catalog_of_ones_own_decides() -> None:
    catalog = xids.XidCatalog(
        version=1,
        date=xids.packaged().date,
        upstream_snapshot="test",
        sources=("test",),
        default=XidAction.DRAIN_AND_REPLACE,
        entries={},
    )
    tracker = HealthTracker((), catalog)

    event = tracker.on_event(_xid(13), SESSION, None)

    assert event is not None and event.action is XidAction.DRAIN_AND_REPLACE


def test_an_old_event_without_an_action_reads_as_a_reset_when_unhealthy() -> None:
    old = DeviceHealthChanged.model_validate(
        {"gpu_uuid": UUID, "healthy": False, "reason": "xid", "xid": 48}
    )
    back = DeviceHealthChanged.model_validate(
        {"gpu_uuid": UUID, "healthy": True, "reason": "recovered"}
    )

    assert old.action is None and old.effective_action is XidAction.RESET_GPU
    assert back.effective_action is XidAction.NONE
