"""`gpuop demo --scenario dra`: the tracker keeps each target's device-API switch and the API
its device plugin last said it serves; the live screen shows it per node (`GPU API`); the
scenario puts its targets in a driver pool whose `deviceAPI` is dra (a policy the
orchestrator accepts), asks for claims of NVIDIA's DeviceClass, and succeeds only when both
switches are done with the node serving DRA."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from gpuop.events import Envelope, decode, new_event
from gpuop.events.device_api import (
    DeviceApiState,
    DeviceApiSwitchStarted,
    NodeDeviceApiStateChanged,
)
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.kube import errors
from gpuop.policy import validate_spec
from gpuop_sim.cli import dra_scenario, rollout_view, scenarios, screens
from gpuop_sim.cli.rollout_view import SagaRun, Tracker

S = DeviceApiState
NODES = ["gpu-node-1", "gpu-node-2"]
T0 = datetime(2026, 12, 3, 17, 0, tzinfo=UTC)


def at(event: Any, node: str, seconds: float) -> Envelope:
    return new_event(event, node=node, source="test", now=T0 + timedelta(seconds=seconds))


def feed(tracker: Tracker, envelope: Envelope) -> str | None:
    decoded, payload = decode(envelope.to_bytes())
    return tracker.observe(decoded, payload)


def switched(tracker: Tracker, node: str, to: S = S.DONE) -> None:
    started = DeviceApiSwitchStarted(
        saga_id="sw-1", api=DeviceApi.DRA, previous=DeviceApi.DEVICE_PLUGIN
    )
    feed(tracker, at(started, node, 0))
    path = [S.SWITCH_REQUIRED, S.CORDON_REQUIRED, S.DRAIN_REQUIRED, S.API_SWITCH_REQUIRED, to]
    for i, (before, after) in enumerate(itertools.pairwise(path)):
        moved = NodeDeviceApiStateChanged(
            saga_id="sw-1", api=DeviceApi.DRA, from_state=before, to_state=after, reason="r"
        )
        feed(tracker, at(moved, node, i + 1.0))


def test_a_switch_is_kept_with_its_states_and_the_api_the_plugin_serves() -> None:
    tracker = Tracker(NODES, kind=rollout_view.DEVICE_API, targets=["gpu-node-1"])
    feed(tracker, at(DeviceApiApplied(api=DeviceApi.DEVICE_PLUGIN, serving=True), "gpu-node-1", 0))
    assert tracker.rows["gpu-node-1"].api == "device-plugin"
    switched(tracker, "gpu-node-1")
    feed(tracker, at(DeviceApiApplied(api=DeviceApi.DRA, serving=True, command_id="c" * 32),
                     "gpu-node-1", 9))  # fmt: skip
    run = tracker.runs["gpu-node-1"]
    assert run.state is S.DONE and run.seconds == 4.0
    assert run.states[0] == "device-api-switch-required" and run.states[-1] == "device-api-done"
    assert tracker.rows["gpu-node-1"].kind == rollout_view.DEVICE_API
    assert tracker.rows["gpu-node-1"].api == "dra"
    assert tracker.finished and tracker.counts() == (1, 0, 0)
    feed(tracker, at(DeviceApiApplied(api=DeviceApi.DRA, serving=False), "gpu-node-2", 10))
    assert tracker.rows["gpu-node-2"].api == "dra-off"


def test_the_live_screen_shows_the_api_serving_each_node_once_one_said() -> None:
    tracker = Tracker(NODES, kind=rollout_view.DEVICE_API, targets=["gpu-node-1"])
    screen = screens.LiveScreen(tracker, title="dra")
    assert "GPU API" not in screen.render()[2]
    switched(tracker, "gpu-node-1")
    feed(tracker, at(DeviceApiApplied(api=DeviceApi.DRA, serving=True), "gpu-node-1", 9))
    lines = [screens._ESCAPE.sub("", line) for line in screen.render()]
    assert "GPU API" in lines[2]
    row = next(line for line in lines if line.startswith("gpu-node-1"))
    assert "device-api" in row and "device-api-done" in row and " dra " in row
    other = next(line for line in lines if line.startswith("gpu-node-2"))
    assert " - " in other


def test_the_scenario_puts_its_targets_in_a_dra_pool_the_policy_accepts() -> None:
    assert "dra" in scenarios.SCENARIOS
    played = scenarios.make("dra", cast(Any, None))
    assert isinstance(played, dra_scenario.DraSwitch)
    spec: dict[str, Any] = {"driver": {"gpu": {"version": "580.159.04"}}}
    played.policy(spec)
    policy = validate_spec(spec)
    assert policy.device_api_for({dra_scenario.DRA_LABEL: "true"}) is DeviceApi.DRA
    assert policy.device_api_for({}) is DeviceApi.DEVICE_PLUGIN
    template = dra_scenario._template()
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    pod = dra_scenario._pod("p", "gpu-node-1")
    assert "nodeName" not in pod["spec"]
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == dra_scenario.TEMPLATE


class Nothing:
    """An API server that refuses everything (the later stages are reported, not judged)."""

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        raise errors.KubeError("refused")


async def test_the_scenario_succeeds_only_with_both_switches_done_and_serving_dra() -> None:
    stage = scenarios.Stage(cast(Any, Nothing()), cast(Any, None), {}, {}, 8)
    played = dra_scenario.DraSwitch(stage, targets=list(NODES))
    tracker = Tracker(NODES, kind=rollout_view.DEVICE_API, targets=list(NODES))
    for node in NODES:
        tracker.runs[node] = SagaRun("s", T0, S.DONE, ended=T0)
        tracker.rows[node].api = "dra"
    ok, summary = await played.conclude(tracker)
    assert ok, summary
    assert summary["switched"]["gpu-node-1"]["api"] == "dra"
    assert "refused" in summary["claims"]["error"]

    tracker.runs["gpu-node-2"] = SagaRun("s", T0, S.FAILED, ended=T0)
    ok, summary = await played.conclude(tracker)
    assert not ok and summary["switched"]["gpu-node-2"]["state"] == "device-api-failed"
    tracker.runs["gpu-node-2"] = SagaRun("s", T0, S.DONE, ended=T0)
    tracker.rows["gpu-node-2"].api = "device-plugin"
    ok, _ = await played.conclude(tracker)
    assert not ok, "done but the plugin does not say it serves dra"
