"""The one durable consumer that feeds the decision core: what it subscribes to.

Everything the core decides on arrives here, in the log, in per-node order (the bus never
hands two messages of one node to the handler at once): the subjects of every kind the
runner runs (`SagaKind.subjects`, each once, in the registry's order). The upgrade's are the
inbound set of its fold (`gpuop.saga.upgrade.folding`, which replay reads too): the
orchestrator's own Kubernetes observations and action outcomes (domain `kube`), the
driver-manager's results (`driver`), operand pause and resume confirmations, discovery's
inventories (for the boot id and running versions), expired deadlines and recorded
admissions. The public `upgrade` state changes are not read back by the upgrade: they are
outputs (a remediation folded into it reads some).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuop.bus import Bus, ConsumerSpec, Subscription
from gpuop.saga.kinds import SagaKind
from gpuop.saga.registry import KINDS
from gpuop.services.upgrade_orchestrator.running import Runner

DURABLE = "upgrade-orchestrator"
"""The consumer's durable name: a new leader resumes where the previous one acked."""
ACK_WAIT = 15.0
"""Seconds until the server hands a delivery a dead leader never acked to the next one; the
bus extends it while a live handler works. The controller passes the Lease duration: no
successor can lead sooner, so by the time one does, every message the crashed leader held is
due again and comes before newer ones, in the node's order."""


MAX_IN_FLIGHT_PER_NODE = 16
"""Of the intake's in-flight slots, the most one node's events hold (`gpuop.bus.dispatching`)."""


def consumer_spec(
    prefix: str, ack_wait: float = ACK_WAIT, kinds: Sequence[SagaKind[Any]] = KINDS
) -> ConsumerSpec:
    """The intake consumer over every event the `kinds` decide (`SagaKind.subjects`)."""
    wanted = (subject for kind in kinds for subject in kind.subjects(prefix))
    return ConsumerSpec(
        durable=DURABLE,
        subjects=tuple(dict.fromkeys(wanted)),
        max_deliver=20,
        ack_wait=ack_wait,
        # one node flooding its subjects must not hold every slot: the others' events go on
        max_in_flight_per_node=MAX_IN_FLIGHT_PER_NODE,
        # a first leader has no saga that older events could concern; later leaders resume
        # the durable consumer where the previous one acked
        deliver_new_only=True,
    )


async def start(bus: Bus, runner: Runner, ack_wait: float = ACK_WAIT) -> Subscription:
    """Start consuming into `runner.handle`."""
    kinds = [kind_runner.kind for kind_runner in runner.runners()]
    return await bus.consume(consumer_spec(bus.prefix, ack_wait, kinds), runner.handle)
