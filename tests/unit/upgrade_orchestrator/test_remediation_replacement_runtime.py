"""A drain-and-replace XID in the orchestrator's runtime, on the in-memory bus: the node is
handed over (cordoned, the holders evicted, the label for a repair flow) and held; a release
before discovery shows another GPU in the slot is refused; one after it uncordons, validates
and releases the node; the log replays identically."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.events.remediation import RemediationState as R
from gpuop.saga import actions
from gpuop.saga.remediation.actions import REPLACEMENT_LABEL, EvictPods, MarkReplacement
from tests.support.inventories import H200, inventory
from tests.support.orchestrator import messages
from tests.support.remediations import HOLDER, Remediating, actions_of, remediating
from tests.support.sagas import BOOT_A, policy
from tests.unit.upgrade_orchestrator.test_remediation_runtime import (
    NODE,
    replays_identically,
    states,
)

NEW_GPU = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc6"


async def ask_release(harness: Remediating) -> None:
    """An admin (`gpuop remediation release`) or a repair flow set the label to done."""
    seen = kube.NodeObserved(
        ready=True, unschedulable=True, boot_id=BOOT_A, labels={REPLACEMENT_LABEL: "done"}
    )
    await harness.publish(seen, NODE, source="/gpuop/upgrade-orchestrator")
    await harness.settle()


async def test_drain_and_replace_holds_the_node_until_new_hardware_is_released() -> None:
    async with remediating(policy()) as harness:
        await harness.fault(NODE, action=dev.XidAction.DRAIN_AND_REPLACE)
        await harness.settle()
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.REPLACEMENT_REQUIRED
        assert saga.step.name == "replacement"
        assert saga.slots == {saga.gpu_uuids[0]: H200.pci_bus_id}
        [evicted] = actions_of(harness.stack, EvictPods)
        assert evicted.pods == (HOLDER,)
        assert len(actions_of(harness.stack, actions.Cordon)) == 1
        assert [m.value for m in actions_of(harness.stack, MarkReplacement)] == ["required"]
        commands = await messages(harness.bus, f"{harness.bus.prefix}.cmd.>")
        assert not any(isinstance(p, dm.RebootNode) for _, p in commands)

        await ask_release(harness)  # the old GPU is still what discovery last listed
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.REPLACEMENT_REQUIRED
        assert saga.release_refusals == 1 and not actions_of(harness.stack, actions.Uncordon)

        swapped = inventory(gpus=(H200.model_copy(update={"uuid": NEW_GPU}),), boot_id=BOOT_A)
        await harness.publish(swapped, NODE, source="/gpuop/discovery")
        await ask_release(harness)
        await harness.settle(until_ended=(NODE,))

        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.DONE, saga
        assert len(actions_of(harness.stack, actions.Uncordon)) == 1
        assert [m.value for m in actions_of(harness.stack, MarkReplacement)][-1] is None
        walked = await states(harness.bus.prefix, harness)
        assert walked[-4:] == [
            R.REPLACEMENT_REQUIRED, R.VALIDATION_REQUIRED, R.RELEASE_REQUIRED, R.DONE,
        ]  # fmt: skip
        replays_identically(await harness.export())
