"""Waves (one failure domain after another) and maintenance windows, at admission."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from gpuop.policy.upgrades import MaintenanceWindow, UpgradePolicy
from gpuop.saga import admission
from gpuop.saga.admission import NodeStatus
from tests.support.sagas import T0, S, policy, saga_for

ZONE = "topology.kubernetes.io/zone"
ZONES = {"node-a1": "a", "node-a2": "a", "node-b1": "b", "node-b2": "b", "node-x": None}


def fleet(**overrides: dict[str, str]) -> dict[str, NodeStatus]:
    nodes = {}
    for name, zone in ZONES.items():
        labels = {ZONE: zone} if zone else {}
        labels = {**labels, **overrides.get(name.replace("-", "_"), {})}
        nodes[name] = NodeStatus(labels=labels, skip=admission.skipped_by(labels))
    return nodes


def spec(**upgrade: object):
    return policy(
        max_parallel_upgrades=0, max_unavailable="100%", waves={"topology_label": ZONE}, **upgrade
    )


def sagas(wanted, **states: S):
    made = []
    for name in ZONES:
        saga = saga_for(wanted, node=name)
        state = states.get(name.replace("-", "_"))
        if state is not None:
            saga = saga.model_copy(update={"state": state, "cordoned": state is not S.UPGRADE_DONE})
        made.append(saga)
    return made


def test_one_domain_at_a_time_in_label_order_unlabelled_last() -> None:
    wanted = spec()
    first = admission.plan(sagas(wanted), fleet(), wanted, T0)
    assert (first.nodes, first.wave) == (("node-a1", "node-a2"), "a")
    busy = sagas(wanted, node_a1=S.DRIVER_RELOAD_REQUIRED, node_a2=S.UPGRADE_DONE)
    assert admission.admit(busy, fleet(), wanted, T0) == []  # zone a is not finished
    a_done = sagas(wanted, node_a1=S.UPGRADE_DONE, node_a2=S.UPGRADE_DONE)
    assert admission.admit(a_done, fleet(), wanted, T0) == ["node-b1", "node-b2"]
    b_done = sagas(
        wanted, node_a1=S.UPGRADE_DONE, node_a2=S.UPGRADE_DONE,
        node_b1=S.UPGRADE_DONE, node_b2=S.UPGRADE_DONE,
    )  # fmt: skip
    last = admission.plan(b_done, fleet(), wanted, T0)
    assert (last.nodes, last.wave) == (("node-x",), "")


def test_a_failed_or_skipped_node_does_not_hold_its_domain_back() -> None:
    wanted = spec()
    failed = sagas(wanted, node_a1=S.UPGRADE_FAILED, node_a2=S.UPGRADE_DONE)
    assert admission.admit(failed, fleet(), wanted, T0) == ["node-b1", "node-b2"]
    skipping = fleet(node_a1={"nvidia.com/gpu-driver-upgrade.skip": "true"})
    done_a2 = sagas(wanted, node_a2=S.UPGRADE_DONE)
    assert admission.admit(done_a2, skipping, wanted, T0) == ["node-b1", "node-b2"]


def test_without_waves_every_domain_goes_at_once() -> None:
    wanted = policy(max_parallel_upgrades=0, max_unavailable="100%")
    result = admission.plan(sagas(wanted), fleet(), wanted, T0)
    assert len(result.nodes) == 5 and result.wave is None


SATURDAY_NIGHT = MaintenanceWindow(
    start="22:00", end="04:00", days=("Sat",), time_zone="Europe/Berlin"
)


@pytest.mark.parametrize(
    ("moment", "inside"),
    [
        (datetime(2026, 12, 5, 21, 0, tzinfo=UTC), True),  # Sat 22:00 in Berlin (UTC+1)
        (datetime(2026, 12, 5, 20, 59, tzinfo=UTC), False),
        (datetime(2026, 12, 6, 2, 59, tzinfo=UTC), True),  # Sun 03:59: the night after Sat
        (datetime(2026, 12, 6, 3, 0, tzinfo=UTC), False),  # Sun 04:00 closes
        (datetime(2026, 12, 6, 21, 30, tzinfo=UTC), False),  # Sunday evening: not a window day
        (datetime(2026, 7, 4, 20, 30, tzinfo=UTC), True),  # Sat 22:30 in summer time (UTC+2)
    ],
)
def test_a_window_opens_on_its_days_in_its_time_zone(moment: datetime, inside: bool) -> None:
    assert SATURDAY_NIGHT.contains(moment) is inside


def test_outside_every_window_nothing_is_admitted_and_the_rollout_resumes_at_the_next() -> None:
    weekdays = {"start": "09:00", "end": "17:00", "days": ["Mon", "Tue", "Wed", "Thu", "Fri"]}
    wanted = policy(max_parallel_upgrades=1, maintenance_windows=[weekdays])
    nodes = {f"node-{i}": NodeStatus() for i in range(3)}
    waiting = [saga_for(wanted, node=name) for name in nodes]
    friday_evening = datetime(2026, 12, 4, 17, 0, tzinfo=UTC)
    closed = admission.plan(waiting, nodes, wanted, friday_evening)
    assert closed.nodes == () and closed.outside_window
    for hours in (1, 24, 48, 63):  # the weekend
        assert (
            admission.admit(waiting, nodes, wanted, friday_evening + timedelta(hours=hours)) == []
        )
    monday = admission.plan(waiting, nodes, wanted, friday_evening + timedelta(hours=64))
    assert monday.nodes == ("node-0",) and not monday.outside_window


@pytest.mark.parametrize(
    ("window", "field"),
    [
        ({"start": "25:00", "end": "04:00"}, "start"),
        ({"start": "22:00", "end": "4:00"}, "end"),
        ({"start": "22:00", "end": "04:00", "time_zone": "Mars/Olympus"}, "time_zone"),
        ({"start": "22:00", "end": "04:00", "days": ["Someday"]}, "days"),
        ({"start": "22:00", "end": "04:00", "days": []}, "days"),
    ],
)
def test_a_bad_window_is_refused_naming_the_field(window: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        UpgradePolicy.model_validate({"maintenanceWindows": [window]})
    assert field in str(refused.value).replace("timeZone", "time_zone")
