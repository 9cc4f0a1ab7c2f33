"""The orchestrator's runtime in one process: InMemoryBus, a fake Kubernetes, a virtual clock.

`Stack` wires the store, outbox, deadline scheduler and runner the way the service does, with
`FakeKube` in place of the API server: it records every action and answers each the way the
real executor would on a healthy node. `answers` is what healthy node agents report for each
command, for the fake agents of the tests and the benchmark.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuop.bus import Buckets, ConsumerSpec, Delivery, InMemoryBus
from gpuop.clocks import VirtualClock
from gpuop.events import Envelope, Event, Payload, decode, new_event, subjects
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import kube as observed
from gpuop.events import remediation_commands as remedies
from gpuop.events.fields import NamespacedName
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import NodeSaga, NodeStatus, actions, replaying
from gpuop.saga.remediation import actions as remediation_actions
from gpuop.services.upgrade_orchestrator import intake
from gpuop.services.upgrade_orchestrator.acting import Outbox
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler
from gpuop.services.upgrade_orchestrator.kinds import KindRunner
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.clocks import ManualClock
from tests.support.sagas import GPU_OLD, T0


@dataclass
class FakeKube:
    """`KubeActions` that succeed at once and remember what they were asked."""

    done: list[tuple[str, Any]] = field(default_factory=list)
    marks: dict[str, tuple[bool, bool]] = field(default_factory=dict)
    """Node -> whether a remediation's `GPUHealthy` is True, and its taint on, as the
    `MirrorHealth` actions executed so far left them."""
    diagnostic_fails: str = ""
    """Non-empty: the preflight rung's diagnostic (`all_gpus`) fails, saying this."""

    def _tainted(self, node: str, taint: bool | None) -> bool:
        return self.marks.get(node, (True, False))[1] if taint is None else taint

    async def execute(self, node: str, action: Any) -> observed.KubeEvent | None:
        self.done.append((node, action))
        if isinstance(action, remediation_actions.MirrorHealth):
            self.marks[node] = (not action.unhealthy, self._tainted(node, action.taint))
            return observed.NodeUntainted(action_id=action.id) if action.taint is False else None
        if isinstance(action, remediation_actions.EvictPods):
            return observed.PodsDeleted(action_id=action.id, deleted=len(action.pods))
        if isinstance(action, actions.Cordon):
            return observed.NodeCordoned(action_id=action.id)
        if isinstance(action, actions.Uncordon):
            return observed.NodeUncordoned(action_id=action.id)
        if isinstance(action, actions.Untaint):
            return observed.NodeUntainted(action_id=action.id)
        if isinstance(action, actions.DeletePods):
            return observed.PodsDeleted(action_id=action.id, deleted=0)
        if isinstance(action, actions.Drain):
            return observed.DrainCompleted(action_id=action.id, evicted=0)
        if isinstance(action, actions.RunValidationPod):
            namespace = action.namespace or "default"
            pod = NamespacedName(namespace=namespace, name=f"gpuop-validate-{node}")
            if action.all_gpus and self.diagnostic_fails:
                return observed.ValidationPodFailed(
                    action_id=action.id, pod=pod, message=self.diagnostic_fails,
                    reason=observed.ValidationPodFailureReason.FAILED,
                )  # fmt: skip
            return observed.ValidationPodSucceeded(action_id=action.id, pod=pod)
        return None


def answers(payload: object, command_id: str) -> list[Event]:
    """What healthy node agents report once `payload` is done: the driver-manager's result,
    or every operand's confirmation of a pause or a resume."""
    if isinstance(payload, dm.StageDriver):
        return [dm.DriverStaged(command_id=command_id, component=payload.component,
                                version=payload.version)]  # fmt: skip
    if isinstance(payload, dm.InstallDriver):
        return [dm.DriverInstalled(command_id=command_id, component=payload.component,
                                   version=payload.version)]  # fmt: skip
    if isinstance(payload, dm.UnloadDriver):
        return [dm.DriverUnloaded(command_id=command_id, component=payload.component,
                                  version=GPU_OLD)]  # fmt: skip
    if isinstance(payload, dm.LoadDriver):
        return [dm.DriverLoaded(command_id=command_id, component=payload.component,
                                version=payload.version)]  # fmt: skip
    if isinstance(payload, dm.ValidateDriver):
        return [dm.DriverValidated(command_id=command_id, component=payload.component,
                                   version=payload.version, devices=8)]  # fmt: skip
    if isinstance(payload, dm.ConfigureRuntime):
        return [dm.RuntimeConfigured(command_id=command_id, component=payload.component,
                                     runtime="containerd", changed=True,
                                     drop_in="/etc/containerd/conf.d/99-nvidia.toml")]  # fmt: skip
    if isinstance(payload, dev.PauseOperands):
        return [dev.OperandPaused(command_id=command_id, service=s) for s in dev.OperandService]
    if isinstance(payload, dev.ResumeOperands):
        return [dev.OperandResumed(command_id=command_id, service=s) for s in dev.OperandService]
    if isinstance(payload, remedies.ResetGpu):
        return [remedies.GpuReset(command_id=command_id, gpu_uuids=payload.gpu_uuids,
                                  method=remedies.ResetMethod.NVML)]  # fmt: skip
    if isinstance(payload, remedies.ListGpuHolders):
        return [remedies.GpuHoldersListed(command_id=command_id, gpu_uuids=payload.gpu_uuids)]
    return []


@dataclass
class Stack:
    """One orchestrator process on a shared bus."""

    bus: InMemoryBus
    policy: GPUClusterPolicySpec
    kube: Any = field(default_factory=FakeKube)
    """The `KubeActions`: a `FakeKube` unless a test hands it the real executor."""
    clock: VirtualClock = field(default_factory=lambda: ManualClock(T0))
    store_type: type[SagaStore] = SagaStore
    store: SagaStore | None = None
    outbox: Outbox | None = None
    deadlines: DeadlineScheduler | None = None
    runner: Runner | None = None

    async def start(self) -> Runner:
        self.store = self.store_type(await self.bus.kv(Buckets.SAGAS))
        self.outbox = Outbox(self.bus, self.kube, clock=self.clock)
        self.deadlines = DeadlineScheduler(self.bus, clock=self.clock)
        self.runner = Runner(
            self.bus, self.store, self.outbox, self.deadlines, lambda: self.policy,
            clock=self.clock,
        )  # fmt: skip
        return self.runner

    async def stop(self) -> None:
        assert self.outbox is not None and self.deadlines is not None
        await self.outbox.close()
        await self.deadlines.close()

    async def saga(self, node: str) -> NodeSaga:
        assert self.store is not None
        stored = await self.store.get(node)
        assert stored is not None
        return stored.saga


async def messages(bus: InMemoryBus, subject: str) -> list[tuple[Envelope, Payload]]:
    """Every stored message on `subject`, decoded, in order."""
    found = []
    async for message in bus.read(subject):
        found.append(decode(message.data))
    return found


def events(bus_prefix: str, domain: str, node: str | None = None, name: str = "*") -> str:
    return subjects.events_filter(domain, node, name, prefix=bus_prefix)


def replays_identically(lines: list[str]) -> replaying.Replayed:
    """`gpuop replay` of an exported log: every decision the same, or the test fails with
    replay's report."""
    log = replaying.parse_log(lines)
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()
    return replayed


@dataclass
class KindHarness:
    """A running orchestrator with one more saga kind (its store), on `bus`: what the kinds'
    runtime harnesses share. `settle` runs admission passes until the sagas rest."""

    bus: InMemoryBus
    stack: Stack
    store: SagaStore[Any]
    nodes: tuple[str, ...]

    async def saga(self, node: str) -> Any:
        stored = await self.store.get(node)
        return None if stored is None else stored.saga

    async def started(self, node: str) -> Any:
        async with asyncio.timeout(5):
            while (saga := await self.saga(node)) is None:
                await asyncio.sleep(0.005)
        return saga

    async def settle(self, *, until_ended: tuple[str, ...] = (), quiet: float = 0.15) -> None:
        """Admission passes until the nodes `until_ended` name have ended, then until
        nothing changes for `quiet` seconds."""
        runner = self.stack.runner
        assert runner is not None and self.stack.outbox is not None
        loop = asyncio.get_running_loop()
        calm_from: float | None = None
        async with asyncio.timeout(10):
            while calm_from is None or loop.time() - calm_from < quiet:
                statuses = {n: NodeStatus() for n in self.nodes}
                await runner.admit(statuses, self.stack.clock.now())
                sagas = [await self.saga(node) for node in until_ended]
                ended = all(s is not None and self.store.kind.ended(s) for s in sagas)
                if ended and calm_from is None:
                    calm_from = loop.time()
                await asyncio.sleep(0.01)
            await self.stack.outbox.idle()


Answer = Callable[[str, object, str], list[Event]]
"""How fake node agents answer a command: (node, payload, command id) -> their events."""


@asynccontextmanager
async def running_kind(
    spec: GPUClusterPolicySpec,
    kind_runner: Callable[[InMemoryBus, Stack, Runner], Awaitable[KindRunner[Any]]],
    answer: Answer,
    source: str = "/gpuop/agent",
) -> AsyncIterator[tuple[InMemoryBus, Stack, SagaStore[Any]]]:
    """An orchestrator on an InMemoryBus running the upgrade and the kind `kind_runner`
    makes (its starter and store), the intake feeding it, node agents answering every
    command through `answer` (published from `source`): the bus, the stack and the kind's
    store; everything stopped after."""
    bus = InMemoryBus()
    await bus.start()
    stack = Stack(bus, spec)
    runner = await stack.start()
    made = await kind_runner(bus, stack, runner)
    runner.kinds = (made,)

    async def agent(delivery: Delivery) -> None:
        envelope = delivery.envelope
        for event in answer(envelope.node, delivery.payload, envelope.id):
            await bus.publish(
                new_event(event, node=envelope.node, source=source,
                          causationid=envelope.id, now=stack.clock.now())
            )  # fmt: skip

    consumer = await bus.consume(
        ConsumerSpec(durable="agents", subjects=(subjects.stream_filter(subjects.Kind.COMMAND),)),
        agent,
    )
    subscription = await intake.start(bus, runner)
    await runner.record_policy(spec)
    try:
        yield bus, stack, made.store
    finally:
        await subscription.stop()
        await consumer.stop()
        await stack.stop()
        await bus.close()


def actions_of(stack: Stack, kind: type[Any]) -> list[Any]:
    """The Kubernetes actions of `kind` the fake API server was asked for, in order."""
    return [action for _, action in stack.kube.done if isinstance(action, kind)]
