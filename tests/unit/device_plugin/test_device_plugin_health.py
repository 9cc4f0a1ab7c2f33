"""Which device events make a GPU unhealthy, and what makes it healthy again."""

from __future__ import annotations

import pytest

from gpuop.events import device
from gpuop.health import APPLICATION_XIDS
from gpuop.services.device_plugin.health import HealthBook

GPU = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"


def xid(number: int, uuid: str = GPU) -> device.DeviceHealthChanged:
    return device.DeviceHealthChanged(
        gpu_uuid=uuid, healthy=False, reason=device.HealthReason.XID, xid=number
    )


@pytest.mark.parametrize("number", APPLICATION_XIDS)
def test_an_application_xid_leaves_the_gpu_healthy(number: int) -> None:
    book = HealthBook(APPLICATION_XIDS)
    assert not book.apply(xid(number))
    assert book.is_healthy(GPU)


@pytest.mark.parametrize("number", [48, 79, 94, 95])
def test_a_critical_xid_makes_the_gpu_unhealthy(number: int) -> None:
    book = HealthBook(APPLICATION_XIDS)
    assert book.apply(xid(number))
    assert not book.is_healthy(GPU)
    assert book.unhealthy == {GPU: f"XID {number}"}
    assert not book.apply(xid(number)), "already unhealthy: no change"


def test_the_ignored_list_is_configurable() -> None:
    book = HealthBook([79])
    assert not book.apply(xid(79))
    assert book.apply(xid(13))


@pytest.mark.parametrize("reason", [device.HealthReason.ECC, device.HealthReason.UNREACHABLE])
def test_ecc_errors_and_a_lost_gpu_make_it_unhealthy(reason: device.HealthReason) -> None:
    book = HealthBook(APPLICATION_XIDS)
    event = device.DeviceHealthChanged(gpu_uuid=GPU, healthy=False, reason=reason, message="x")
    assert book.apply(event)
    assert book.unhealthy == {GPU: f"{reason}: x"}


def test_a_reported_recovery_does_not_make_it_healthy() -> None:
    book = HealthBook(APPLICATION_XIDS)
    book.apply(xid(79))
    recovered = device.DeviceHealthChanged(
        gpu_uuid=GPU, healthy=True, reason=device.HealthReason.RECOVERED
    )
    assert not book.apply(recovered)
    assert not book.is_healthy(GPU)


def marked(reason: device.HealthReason, action: device.XidAction) -> device.DeviceHealthChanged:
    return device.DeviceHealthChanged(gpu_uuid=GPU, healthy=False, reason=reason, action=action)


RECOVERED = device.DeviceHealthChanged(
    gpu_uuid=GPU, healthy=True, reason=device.HealthReason.RECOVERED
)


def test_a_gpu_only_marked_is_healthy_again_when_its_condition_ends() -> None:
    book = HealthBook(APPLICATION_XIDS)
    assert book.apply(marked(device.HealthReason.CLOCKS, device.XidAction.MARK))
    assert not book.is_healthy(GPU)
    assert book.apply(RECOVERED)
    assert book.is_healthy(GPU)


def test_a_marked_gpu_that_then_asked_for_a_reset_stays_unhealthy_on_recovery() -> None:
    book = HealthBook(APPLICATION_XIDS)
    book.apply(marked(device.HealthReason.CLOCKS, device.XidAction.MARK))
    book.apply(marked(device.HealthReason.NVLINK, device.XidAction.RESET_GPU))
    assert not book.apply(RECOVERED)
    assert not book.is_healthy(GPU)


def test_a_validated_driver_reload_makes_every_gpu_healthy() -> None:
    other = "GPU-00000000-0000-0000-0000-000000000001"
    book = HealthBook(APPLICATION_XIDS)
    book.apply(xid(79))
    book.apply(xid(48, other))
    assert book.reset() == sorted([GPU, other])
    assert book.is_healthy(GPU) and book.is_healthy(other)
    assert book.reset() == []
