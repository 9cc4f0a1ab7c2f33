"""Status conditions keep their transition time until their status changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuop.policy import ConditionType, PolicyStatus, condition, set_condition

T0 = datetime(2026, 3, 1, 12, 0, 0, 900_000, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_a_condition_is_kept_to_the_second_and_accepts_a_bool() -> None:
    ready = condition(ConditionType.READY, True, "AllNodesUpgraded", "8 of 8 nodes done", now=T0)

    assert ready.status == "True"
    assert ready.last_transition_time == datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_an_unchanged_status_keeps_its_transition_time() -> None:
    before = (condition(ConditionType.PROGRESSING, True, "RolloutInProgress", "1 of 8", now=T0),)

    after = set_condition(
        before, condition(ConditionType.PROGRESSING, True, "RolloutInProgress", "5 of 8", now=T1)
    )

    assert after[0].message == "5 of 8"
    assert after[0].last_transition_time == before[0].last_transition_time


def test_a_changed_status_takes_the_new_transition_time() -> None:
    before = (condition(ConditionType.PROGRESSING, True, "RolloutInProgress", now=T0),)

    after = set_condition(before, condition(ConditionType.PROGRESSING, False, "Done", now=T1))

    assert after[0].last_transition_time == T1.replace(microsecond=0)


def test_set_condition_replaces_in_place_and_appends_new_types() -> None:
    status = PolicyStatus(
        conditions=(
            condition(ConditionType.VALID, True, "ValidSpec", now=T0),
            condition(ConditionType.READY, False, "RolloutInProgress", now=T0),
        )
    )

    status = status.with_condition(condition(ConditionType.READY, True, "Upgraded", now=T1))
    status = status.with_condition(condition(ConditionType.PROGRESSING, False, "Idle", now=T1))

    assert [c.type for c in status.conditions] == ["Valid", "Ready", "Progressing"]
    ready = status.condition_of(ConditionType.READY)
    assert ready is not None and ready.status == "True"
    assert status.condition_of("Degraded") is None


def test_an_overlong_message_is_cut_to_what_the_api_server_accepts() -> None:
    long = condition(ConditionType.VALID, False, "InvalidSpec", "x" * 40_000, now=T0)

    assert len(long.message) == 32768


def test_status_round_trips_through_its_wire_form_and_ignores_unknown_fields() -> None:
    status = PolicyStatus(
        observed_generation=4,
        conditions=(condition(ConditionType.READY, False, "RolloutInProgress", "2 of 4", now=T0),),
        nodes={"upgrade-done": 2, "drain-required": 1, "upgrade-required": 1},
    )
    wire = status.to_wire()

    assert wire["observedGeneration"] == 4
    assert wire["nodes"] == {"upgrade-done": 2, "drain-required": 1, "upgrade-required": 1}
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-03-01T12:00:00Z"
    assert PolicyStatus.model_validate({**wire, "phase": "written-by-a-newer-replica"}) == status
