"""The driver-manager on the bus: its node's commands in, one recorded result event out each.

`main` (the service's entry point, run by `gpuop run driver-manager`) builds the host-side
collaborators from the settings and the `--config` file, takes the host's state lock, removes
what interrupted installs left behind, puts the recorded MIG layout back if the running
driver lost it (`executor.Executor.catch_up_mig`: the node rebooted), and consumes
`gpuop.cmd.driver-manager.<node>.*` with a durable consumer of its own node, so no other
node's command ever reaches it.

`CommandAgent.handle` is the one path of every command:

    RebootNode of an earlier boot -> drop it (the boot id guard; even a recorded one)
    record done      -> republish the recorded result (same event id, so the bus drops it as
                        a duplicate within its window) and do nothing else
    otherwise        -> record started (with its context), execute, record the result, publish
    RebootNode       -> record started, publish RebootStarted, reboot, record done

Results carry the command's id (`causationid`) and its correlation id (the saga), or the
command's id when it has none, and the trace context of the command's `handle <verb>` span;
the result's own id is derived from the command id. A bus
that cannot take the result raises `TemporaryError`: the command comes again and its
recorded result is published then.
"""

from __future__ import annotations

import logging
from functools import partial

from prometheus_client import CollectorRegistry, Counter

from gpuop import plugins
from gpuop.bus import (
    Bus,
    BusError,
    ConsumerSpec,
    Delivery,
    PermanentError,
    TemporaryError,
    grants,
    spans,
)
from gpuop.bus.protocol import UnknownErrors
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import Command, Envelope, ids, new_event
from gpuop.events import driver as dm
from gpuop.host.cuda import CudaProbe, LibcudaProbe
from gpuop.host.protocol import KernelOps, Rebooter, SimulatedHost
from gpuop.host.resets import FunctionResets, SysfsFunctionResets
from gpuop.host.restarting import RuntimeService, SystemdRuntimeService
from gpuop.host.roots import HostRoot
from gpuop.host.subprocesses import SubprocessKernelOps
from gpuop.nvml import NvmlError, open_backend, opened
from gpuop.observability import tracing
from gpuop.runtime import waiting
from gpuop.runtime.services import ServiceContext
from gpuop.runtime.settings import Settings
from gpuop.services.driver_manager import config as configuration
from gpuop.services.driver_manager.answers import ComponentCommand
from gpuop.services.driver_manager.config import DriverManagerConfig, KernelMode
from gpuop.services.driver_manager.executor import Executor, Outcome
from gpuop.services.driver_manager.installing import Installer, clean_staging
from gpuop.services.driver_manager.rebooting import (
    HostRebooter,
    RebootFailed,
)
from gpuop.services.driver_manager.reloading import Reloader
from gpuop.services.driver_manager.runtimes import RuntimeConfigurer
from gpuop.services.driver_manager.state import (
    CommandRecord,
    CommandStatus,
    ComponentRecord,
    StateCorrupt,
    StateLock,
    StateStore,
)
from gpuop.services.driver_manager.validating import NvmlFactory, Validator

log = logging.getLogger(__name__)

LOCK_RETRY_SECONDS = 2.0
STARTUP_MIG_SECONDS = 120.0
"""How long the CDI spec written after putting the MIG layout back at start may take."""
NVML_HOLDER = "driver-manager"


def result_id(command_id: str) -> str:
    """The id of the result of `command_id`: the same every time it is answered."""
    return ids.result(command_id)


class CommandAgent:
    """Executes one node's driver commands idempotently by command id."""

    def __init__(
        self,
        bus: Bus,
        node: str,
        executor: Executor,
        store: StateStore,
        registry: CollectorRegistry,
    ) -> None:
        self.bus = bus
        self.node = node
        self.executor = executor
        self.store = store
        self.source = f"/gpuop/{dm.SERVICE}/{node}"
        self._commands = Counter(
            "gpuop_driver_commands",
            "Driver commands answered, by verb and outcome (executed, replayed, dropped).",
            ["verb", "outcome"],
            registry=registry,
        )

    def consumer_spec(self, config: DriverManagerConfig) -> ConsumerSpec:
        (found,) = grants.consumers(grants.Identity(dm.SERVICE, self.node), prefix=self.bus.prefix)
        return ConsumerSpec(
            durable=found.durable,
            subjects=found.filters,
            max_deliver=config.max_deliver,
            ack_wait=config.ack_wait_seconds,
            max_in_flight=1,
            on_unknown_error=UnknownErrors.RETRY,
            retry_delay=5.0,
        )

    async def handle(self, delivery: Delivery) -> None:
        """One command, in its `handle <verb>` span: the result event is its child."""
        with spans.handling(__name__, delivery):
            await self._handle(delivery)

    async def _handle(self, delivery: Delivery) -> None:
        command = delivery.payload
        if not isinstance(command, Command) or command.SERVICE != dm.SERVICE:
            raise PermanentError(f"{delivery.envelope.type} is not a driver-manager command")
        envelope = delivery.envelope
        command_id = envelope.id
        record = self.store.command(command_id)
        if isinstance(command, dm.RebootNode) and self.executor.rebooted_since(command):
            # checked before any replay: after the reboot, discovery's new boot id answers
            log.info("dropping reboot %s: the node booted again since", command_id)
            if record is None or record.status is CommandStatus.STARTED:
                self.store.finish(command_id, None)
            self._commands.labels(command.VERB, "dropped").inc()
            return
        if record is not None and record.status is CommandStatus.DONE:
            answer = record.result_envelope()
            log.info("command %s (%s) was answered before; replaying", command_id, record.verb)
            if answer is not None:
                await self._publish(answer, republish=True)
            self._commands.labels(command.VERB, "replayed").inc()
            return
        if record is not None:
            log.warning(
                "resuming %s %s, begun %d time(s) before", command.VERB, command_id, record.attempts
            )
        answer, outcome, component = await execute_recorded(
            self.executor,
            self.store,
            command_id,
            command,
            record,
            node=self.node,
            source=self.source,
            correlationid=envelope.correlationid or command_id,
        )
        # begun before: its result may be stored already (a crash after the publish)
        again = record is not None
        if outcome.after is None:
            self.store.finish(command_id, answer, component, outcome.changes)
            await self._publish(answer, republish=again)
        else:
            await self._publish(answer, republish=again)
            try:
                await outcome.after()
            except RebootFailed as exc:
                raise TemporaryError(str(exc), delay=10.0) from exc
            self.store.finish(command_id, answer, component, outcome.changes)
        log.info("%s %s: %s", command.VERB, command_id, outcome.result.NAME)
        self._commands.labels(command.VERB, "executed").inc()

    async def _publish(self, answer: Envelope, *, republish: bool) -> None:
        """Publish a result. Its id stored by someone else first (`IdTaken`, an alarm the
        bus logs and counts) is retried as any failure: the next try resumes the command,
        and takes a duplicate as the earlier copy."""
        try:
            await self.bus.publish(answer, republish=republish)
        except BusError as exc:
            raise TemporaryError(f"result {answer.id} not published: {exc}", delay=2.0) from exc


async def execute_recorded(
    executor: Executor,
    store: StateStore,
    command_id: str,
    command: Command,
    record: CommandRecord | None,
    *,
    node: str,
    source: str,
    correlationid: str,
) -> tuple[Envelope, Outcome, str | None]:
    """Record `command` started in `store` (with what it saw before changing anything, or
    the context of its earlier `record` when it resumes), execute it and wrap its result as
    the answer's envelope; the answer, the outcome and the component it changed. The caller
    records it done (`store.finish`) once the answer is out: the agent around its publish,
    `gpuop driver` (the break-glass CLI) after printing it."""
    context = record.context if record is not None else await executor.context_for(command)
    component = command.component if isinstance(command, ComponentCommand) else None
    started = store.start(command_id, command.VERB, context)
    outcome = await executor.execute(
        command_id,
        command,
        started.context,
        store.load().component(component) if component else ComponentRecord(),
    )
    answer = new_event(
        outcome.result,
        node=node,
        source=source,
        id=result_id(command_id),
        correlationid=correlationid,
        causationid=command_id,
        traceparent=tracing.current_traceparent(),
    )
    return answer, outcome, component


def kernel_mode(settings: Settings, config: DriverManagerConfig) -> KernelMode:
    """The configured kernel mode, with `auto` decided: a simulated NVML means a simulated
    node."""
    if config.kernel is not KernelMode.AUTO:
        return config.kernel
    return KernelMode.SIMULATED if settings.nvml.startswith("sim:") else KernelMode.HOST


def gpus_seen(nvml: NvmlFactory) -> int:
    """The GPUs an NVML session sees now; 0 when NVML cannot start (no driver loaded)."""
    try:
        with opened(nvml()) as session:
            return session.device_count()
    except NvmlError:
        return 0


def build_executor(
    settings: Settings, config: DriverManagerConfig, clock: Clock = SYSTEM_CLOCK
) -> Executor:
    """The executor for the host the settings name, with the collaborators its mode needs."""
    if settings.node is None:
        raise ValueError("the driver-manager needs --node")
    root = HostRoot(settings.host_root)
    mode = kernel_mode(settings, config)
    nvml = partial(
        open_backend,
        settings.nvml,
        host_root=settings.host_root,
        node=settings.node,
        holder_id=NVML_HOLDER,
    )
    kernel: KernelOps
    rebooter: Rebooter
    cuda: CudaProbe
    resets: FunctionResets
    if mode is KernelMode.HOST:
        kernel, rebooter = SubprocessKernelOps(root, chroot=True), HostRebooter(root)
        runtime: RuntimeService = SystemdRuntimeService(root)
        cuda = LibcudaProbe(root)
        resets = SysfsFunctionResets(root)
    else:  # both only ever act on a simulated host root, which the plugin reboots
        simulated: SimulatedHost = plugins.load(
            "gpuop.kernels", "simulated", wanted_for=f"kernel mode {mode.value}"
        )(root)
        rebooter = simulated.rebooter
        runtime = simulated.runtime
        resets = simulated.function_resets
        kernel = (
            SubprocessKernelOps(root, chroot=False)
            if mode is KernelMode.STANDINS
            else simulated.kernel
        )
        cuda = simulated.cuda_probe(partial(gpus_seen, nvml))
    return Executor(
        root,
        config,
        Installer(root, kernel, config, clock),
        Reloader(root, kernel, clock, config.unload_poll_seconds),
        Validator(root, nvml, clock, cuda),
        rebooter,
        runtimes=RuntimeConfigurer(root, runtime, clock),
        resets=resets,
    )


async def main(context: ServiceContext) -> None:
    """Run the driver-manager until `context.stopping` is set."""
    settings = context.settings
    config = configuration.load(settings.config)
    executor = build_executor(settings, config)
    assert settings.node is not None  # build_executor checked
    root = executor.root
    if not root.path.is_dir():
        # never create a host root: a wrong --host-root must not become a fake host
        context.not_ready_reason = f"host root {root.path} does not exist (--host-root)"
        log.error("%s", context.not_ready_reason)
        await context.stopping.wait()
        return
    lock = StateLock(root)
    while not lock.try_acquire():
        context.not_ready_reason = f"another driver-manager holds {lock.path}"
        log.warning("%s; waiting", context.not_ready_reason)
        if await waiting.stopped_within(context.stopping, LOCK_RETRY_SECONDS):
            return
    try:
        for path in clean_staging(root):
            log.warning("removed what an interrupted install left: %s", path)
        store = StateStore(root)
        try:
            state = store.load()
        except StateCorrupt as exc:
            context.not_ready_reason = f"driver state unreadable, refusing to act: {exc}"
            log.error("%s", context.not_ready_reason)
            await context.stopping.wait()
            return
        for command_id, record in state.commands.items():
            if record.status is CommandStatus.STARTED:
                log.warning(
                    "%s %s was interrupted; it resumes when redelivered", record.verb, command_id
                )
        await executor.catch_up_mig(STARTUP_MIG_SECONDS)
        agent = CommandAgent(context.bus, settings.node, executor, store, context.registry)
        subscription = await context.bus.consume(agent.consumer_spec(config), agent.handle)
        try:
            context.ready = True
            context.not_ready_reason = ""
            log.info(
                "executing driver commands for %s (kernel: %s)",
                settings.node,
                kernel_mode(settings, config),
            )
            await context.stopping.wait()
        finally:
            context.ready = False
            await subscription.stop()
    finally:
        lock.release()
