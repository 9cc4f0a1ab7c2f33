"""The simulated kubelet's stage table: which stage a pod is in, and how long it waits."""

from __future__ import annotations

import pytest

from gpuop_sim.cluster import stages
from gpuop_sim.cluster.podstatus import RUN_SECONDS_ANNOTATION
from gpuop_sim.cluster.stages import Next, Timings, stage_of

TIMINGS = Timings(start_delay=0.2, termination_cap=1.0, heartbeat_interval=5.0)


def pod(phase: str | None = None, *, deleting: float | None = None, run: str | None = None):
    metadata: dict = {"name": "p", "namespace": "ns", "uid": "u1"}
    if deleting is not None:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["deletionGracePeriodSeconds"] = deleting
    if run is not None:
        metadata["annotations"] = {RUN_SECONDS_ANNOTATION: run}
    return {"metadata": metadata, "status": {"phase": phase} if phase else {}}


@pytest.mark.parametrize(
    ("obj", "admitted", "expected"),
    [
        (pod(), False, None),  # bound, not admitted yet: admission decides first
        (pod(), True, "pod-ready"),
        (pod("Running"), True, "pod-ready"),  # restarting after a reboot
        (pod("Running"), False, None),  # runs for ever
        (pod("Running", run="3"), False, "pod-complete"),
        (pod("Running", run="3"), True, "pod-ready"),  # a restart first
        (pod("Pending", run="3"), False, None),
        (pod("Running", deleting=30, run="3"), False, "pod-delete"),  # deletion wins
        (pod(deleting=0), True, "pod-delete"),
        (pod("Succeeded"), False, None),
        (pod("Failed"), False, None),
    ],
)
def test_a_pod_takes_the_first_stage_that_selects_it(obj, admitted, expected):
    stage = stage_of(obj, admitted)
    assert (stage.name if stage else None) == expected


def test_delays_come_from_settings_annotations_and_the_capped_grace_period():
    by_name = {s.name: s for s in stages.POD_STAGES}
    assert by_name["pod-ready"].delay.seconds(pod(), TIMINGS) == 0.2
    assert by_name["pod-complete"].delay.seconds(pod("Running", run="2.5"), TIMINGS) == 2.5
    assert by_name["pod-delete"].delay.seconds(pod(deleting=30), TIMINGS) == 1.0  # capped
    assert by_name["pod-delete"].delay.seconds(pod(deleting=0), TIMINGS) == 0.0
    assert stages.NODE_HEARTBEAT.delay.seconds({"metadata": {}}, TIMINGS) == 5.0


def test_a_malformed_run_seconds_annotation_is_an_error_not_a_silent_default():
    complete = next(s for s in stages.POD_STAGES if s.name == "pod-complete")
    with pytest.raises(ValueError):
        complete.delay.seconds(pod("Running", run="soon"), TIMINGS)


def test_every_next_of_the_table_is_one_the_kubelet_does():
    used = {s.next for s in (*stages.POD_STAGES, stages.NODE_HEARTBEAT)}
    assert used == set(Next)
    assert len({s.name for s in stages.POD_STAGES}) == len(stages.POD_STAGES)
