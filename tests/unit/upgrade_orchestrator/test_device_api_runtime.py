"""The device-API switch in the orchestrator's runtime, on the in-memory bus: a node whose
device plugin serves another API than the policy wants (top level or its pool's) is
cordoned, drained, switched, validated with a claim and uncordoned; a refused switch
switches back and fails, and is not started again by itself; `gpuop replay` reproduces
every decision."""

from __future__ import annotations

from gpuop.cli.events import export_lines
from gpuop.events import dra
from gpuop.events.device_api import (
    DeviceApiState,
    DeviceApiSwitchStarted,
    NodeDeviceApiStateChanged,
)
from gpuop.events.device_api_commands import DeviceApi
from gpuop.policy import DriverSpec
from gpuop.policy.drivers import DriverPool
from gpuop.saga import actions, replaying
from gpuop.saga.device_api.folding import started
from tests.support.device_api_runtime import DevicePlugins, actions_of, switching
from tests.support.device_api_sagas import policy
from tests.support.orchestrator import events, messages, replays_identically

NODE = "gpu-node-1"
S = DeviceApiState
D = DeviceApi


async def published_states(harness: object, node: str = NODE) -> list[DeviceApiState]:
    bus = harness.bus  # type: ignore[attr-defined]
    found = await messages(bus, events(bus.prefix, "device-api", node))
    return [p.to_state for _, p in found if isinstance(p, NodeDeviceApiStateChanged)]


async def test_a_node_serving_the_device_plugin_is_switched_to_dra_the_policy_wants():
    async with switching(policy(device_api="dra")) as harness:
        await harness.reports(NODE, D.DEVICE_PLUGIN)
        saga = await harness.started(NODE)
        assert (saga.api, saga.previous) == (D.DRA, D.DEVICE_PLUGIN)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is S.DONE, saga
        assert await published_states(harness) == [
            S.CORDON_REQUIRED, S.DRAIN_REQUIRED, S.API_SWITCH_REQUIRED,
            S.VALIDATION_REQUIRED, S.UNCORDON_REQUIRED, S.DONE,
        ]  # fmt: skip
        assert harness.plugins.asked == [(NODE, D.DRA)]
        [pod] = actions_of(harness.stack, actions.RunValidationPod)
        assert pod.device_class == dra.DRIVER
        assert len(actions_of(harness.stack, actions.Uncordon)) == 1

        # the plugin's answer and the next resync agree with the policy: nothing more
        await harness.observe(NODE)
        await harness.reports(NODE, D.DRA)
        await harness.settle()
        again = await harness.saga(NODE)
        assert again is not None and again.saga_id == saga.saga_id
        assert harness.plugins.asked == [(NODE, D.DRA)]


async def test_a_node_that_said_nothing_switches_when_the_policy_wants_dra_and_not_else():
    async with switching(policy(device_api="dra"), ("gpu-node-1", "gpu-node-2")) as harness:
        await harness.observe(NODE)
        saga = await harness.started(NODE)
        assert saga.previous is D.DEVICE_PLUGIN
    async with switching(policy()) as harness:
        await harness.observe(NODE)
        await harness.reports(NODE, D.DEVICE_PLUGIN)
        await harness.settle()
        assert await harness.saga(NODE) is None
        assert harness.plugins.asked == []


async def test_a_pools_device_api_switches_its_nodes_only():
    pool = DriverPool(name="dra", node_selector="gpuop.io/pool=dra", device_api="dra")
    spec = policy().model_copy(
        update={"driver": DriverSpec(gpu=policy().driver.gpu, pools=(pool,))}
    )
    labels = {"gpu-node-2": {"gpuop.io/pool": "dra"}}
    nodes = ("gpu-node-1", "gpu-node-2")
    async with switching(spec, nodes, labels=labels) as harness:
        for node in nodes:
            await harness.reports(node, D.DEVICE_PLUGIN)
        await harness.started("gpu-node-2")
        await harness.settle(until_ended=("gpu-node-2",))
        assert await harness.saga("gpu-node-1") is None
        assert harness.plugins.asked == [("gpu-node-2", D.DRA)]
        saga = await harness.saga("gpu-node-2")
        assert saga is not None and "its driver pool's deviceAPI wants dra" in saga.reason


async def test_a_switch_the_kubelet_refuses_is_switched_back_failed_and_not_retried_alone():
    plugins = DevicePlugins(refuse=frozenset({D.DRA}))
    async with switching(policy(device_api="dra"), plugins=plugins) as harness:
        await harness.reports(NODE, D.DEVICE_PLUGIN)
        await harness.started(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is S.FAILED
        assert saga.switched_back is True and not saga.cordoned
        assert harness.plugins.asked == [(NODE, D.DRA), (NODE, D.DEVICE_PLUGIN)]
        assert S.SWITCH_BACK_REQUIRED in await published_states(harness)

        await harness.observe(NODE)  # a resync: the same switch would fail the same way
        await harness.settle()
        latest = await harness.saga(NODE)
        assert latest is not None and latest.saga_id == saga.saga_id


async def test_the_recorded_start_rebuilds_the_same_saga():
    async with switching(policy(device_api="dra")) as harness:
        await harness.reports(NODE, D.DEVICE_PLUGIN)
        saga = await harness.started(NODE)
        await harness.settle(until_ended=(NODE,))
        found = await messages(
            harness.bus, events(harness.bus.prefix, "device-api", NODE, "started")
        )
        [(envelope, start)] = found
        assert isinstance(start, DeviceApiSwitchStarted)
        rebuilt = started(NODE, start, saga.step_started)
        assert rebuilt == saga.model_copy(update={"state": S.SWITCH_REQUIRED})
        assert envelope.correlationid == saga.saga_id


async def test_gpuop_replay_reproduces_every_decision_of_each_switch():
    plugins = DevicePlugins(refuse=frozenset({D.DEVICE_PLUGIN}))
    nodes = ("gpu-node-1", "gpu-node-2")
    async with switching(policy(device_api="dra"), nodes, plugins=plugins) as harness:
        await harness.reports("gpu-node-1", D.DEVICE_PLUGIN)  # switched to DRA
        await harness.observe("gpu-node-2")  # said nothing yet: switched to DRA too
        await harness.started("gpu-node-1")
        await harness.started("gpu-node-2")
        await harness.settle(until_ended=nodes)
        harness.stack.policy = policy(device_api="devicePlugin")
        await harness.observe("gpu-node-1")  # back: refused, so switched back to DRA
        await harness.settle()
        lines = await export_lines(harness.bus)
        last = await harness.saga("gpu-node-1")

    assert last is not None and last.state is S.FAILED
    assert (last.api, last.switched_back) == (D.DEVICE_PLUGIN, True)
    replayed = replays_identically(lines)
    assert replayed.nodes == set(nodes)
    recorded = replaying.recorded_outputs(replaying.parse_log(lines))
    commands = [o.type for o in recorded["gpu-node-1"] if o.kind == "command"]
    assert commands.count("io.gpuop.cmd.device-plugin.set-device-api.v1") == 3


async def test_a_policy_change_reaches_a_node_that_says_nothing_through_the_reconcile():
    async with switching(policy()) as harness:
        await harness.reports(NODE, D.DEVICE_PLUGIN)
        await harness.settle()
        assert await harness.saga(NODE) is None
        harness.stack.policy = policy(device_api="dra")
        runner = harness.stack.runner
        assert runner is not None
        [starter] = [kind.starter for kind in runner.kinds]
        await starter.reconcile({NODE: {}}, harness.stack.clock.now())  # type: ignore[union-attr]
        saga = await harness.started(NODE)
        assert (saga.api, saga.previous) == (D.DRA, D.DEVICE_PLUGIN)
        await harness.settle(until_ended=(NODE,))
        assert (await harness.saga(NODE)).state is S.DONE
        # the next reconciles find the node as the policy wants it
        await starter.reconcile({NODE: {}}, harness.stack.clock.now())  # type: ignore[union-attr]
        await harness.settle()
        assert (await harness.saga(NODE)).saga_id == saga.saga_id
