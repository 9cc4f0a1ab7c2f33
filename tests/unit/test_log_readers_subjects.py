"""What reads the log directly (a subject's last message, a replay of a filter) believes a
message only on the subject its type and node declare, as every consumer does
(`gpuop.bus.dispatching`): one about another node on a node's subject is a node's credential
speaking for another (or a hostile message, tests/e2e/test_hostile_input_e2e.py, whose
orchestrator believed such a `DeviceApiApplied` and waited ten minutes on a validation pod
asking a DRA claim of a node without DRA)."""

from __future__ import annotations

from gpuop.bus import InMemoryBus
from gpuop.events import Payload, device, subjects
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.driver import Component
from gpuop.operands import from_log
from gpuop.services.upgrade_orchestrator.device_apis import served
from tests import hostile

NODE, OTHER = "gpu-node-2", "gpu-node-1"


def applied_subject(bus: InMemoryBus, node: str) -> str:
    return subjects.event_subject(
        DeviceApiApplied.DOMAIN, node, DeviceApiApplied.NAME, prefix=bus.prefix
    )


def pause_subject(bus: InMemoryBus, node: str) -> str:
    verb = device.PauseOperands.VERB
    return subjects.command_subject(device.OPERANDS, node, verb, prefix=bus.prefix)


async def publish_on(bus: InMemoryBus, subject: str, about: str, payload: Payload) -> None:
    """`payload` about node `about`, published on `subject`."""
    envelope = hostile.envelope_of(payload, about, f"{about}-{type(payload).__name__}")
    await bus.publish_raw(subject, envelope.to_bytes())


async def test_the_device_api_a_node_serves_is_its_own_word_only(bus: InMemoryBus) -> None:
    plugin = DeviceApiApplied(api=DeviceApi.DEVICE_PLUGIN, serving=True)
    await publish_on(bus, applied_subject(bus, NODE), NODE, plugin)
    found = await served(bus, NODE)
    assert found is not None and found.api is DeviceApi.DEVICE_PLUGIN

    # another node's word on this node's subject is not this node's
    dra = DeviceApiApplied(api=DeviceApi.DRA, serving=True)
    await publish_on(bus, applied_subject(bus, NODE), OTHER, dra)
    assert await served(bus, NODE) is None


async def test_a_pause_about_another_node_does_not_pause_this_one(bus: InMemoryBus) -> None:
    pause = device.PauseOperands(components=(Component.GPU,))
    await publish_on(bus, pause_subject(bus, NODE), OTHER, pause)
    assert await from_log(bus, NODE) == frozenset()

    await publish_on(bus, pause_subject(bus, NODE), NODE, pause)
    assert await from_log(bus, NODE) == frozenset({Component.GPU})
