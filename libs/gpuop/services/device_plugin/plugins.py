"""The device plugin of one node, kubelet side: what it advertises, with which health.

`DevicePlugins` owns the NVML session, the GPU inventory read from it, the RDMA shared
devices, the health book and the pause state, and one `serving.PluginServer` per resource,
kept registered by a `registering.Registrar`. It needs no bus: `agent.NodeAgent` feeds it
the node's health events, driver validations and pause commands, and when NATS is down it
goes on serving the last known health.

    restore   the node's history from the log: the pause it is in, the GPUs' health
    start     read the RDMA devices and (unless paused) open NVML and read the GPUs; serve
              each resource, then register it
    health    an event that makes a GPU unhealthy re-advertises its devices Unhealthy
    validated every GPU healthy again, and NVML read anew (for a validated GPU driver);
              the HCAs read anew (for a validated OFED driver)
    pause     the paused driver's devices advertised Unhealthy; for the GPU driver, NVML
              closed, so the `nvidia` module can be unloaded
    resume    NVML opened and read again, the devices advertised with their health
    dra       `set_advertise_gpus(False)` while the node serves its GPUs through DRA
              (`dra.switching`): `nvidia.com/gpu` advertised with no device, no MPS daemon
    select    the named config the node's label selects (`selecting`): the file read again,
              then, if the config in force changes, its resources planned anew from the
              inventory last read and re-advertised (no restart, no NVML read)
    mps       with every plan, the MPS control daemons it needs (`mpscontrol`): started,
              quit when no longer needed, checked every `check_interval` and started again
              when they fail; quit before NVML is closed for a pause of the GPU driver, and
              started again on resume. An MPS-shared resource's devices are Unhealthy
              while its daemon does not run.

Every change of state holds one lock, so a pause waits for an inventory read to finish,
and a switch of config for both. NVML that cannot be opened (no driver yet: NVML says
`DriverNotLoaded`) is retried every `retry_interval`, logged once per failure: meanwhile no
GPU resource is served or registered and the plugin is not ready, naming the failure.

A switch re-advertises through the servers already serving: a resource that stays
(`nvidia.com/gpu` going from 1 to 4 replicas) keeps its socket and registration and sends
its new device list down the open ListAndWatch stream; a resource that appears
(`nvidia.com/gpu.shared` under `renameByDefault`) gets a server that the registrar then
registers; one that goes is served empty. Allocate answers from the resource it finds when
it is called, so a call the kubelet made before the switch answers with the old config and
every later call with the new one; containers already allocated keep their devices.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from gpuop.events import device
from gpuop.events.driver import Component, DriverValidated
from gpuop.host.errors import HostError
from gpuop.host.roots import HostRoot
from gpuop.kubelet import constants
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2
from gpuop.nvml import Nvml, NvmlError
from gpuop.runtime import waiting
from gpuop.runtime.services import Readiness
from gpuop.runtime.settings import SettingsError
from gpuop.services.device_plugin import cdi, inventory, rdma, registering, selecting
from gpuop.services.device_plugin.config import (
    DeviceListStrategy,
    DevicePluginConfig,
    PluginConfigs,
)
from gpuop.services.device_plugin.health import HealthBook
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.mpscontrol import MpsControl, MpsSupervisor
from gpuop.services.device_plugin.resources import (
    GpuPlan,
    Resource,
    VacantResource,
    gpu_resources,
    mps_daemons,
)
from gpuop.services.device_plugin.serving import PluginServer

log = logging.getLogger(__name__)

RETRY_INTERVAL = 5.0
"""Seconds between attempts to open NVML while it cannot be opened."""

HealthRecord = device.DeviceHealthChanged | DriverValidated
"""What the node's health history is made of."""
Reload = Callable[[], PluginConfigs]
"""Reads the `--config` file again; raises `SettingsError` when it does not validate."""


class DevicePlugins:
    """Every device plugin server of one node, and the state they advertise."""

    def __init__(
        self,
        root: HostRoot,
        nvml: Nvml,
        config: DevicePluginConfig | PluginConfigs,
        metrics: PluginMetrics,
        *,
        reload: Reload | None = None,
        readiness: Readiness | None = None,
        retry_interval: float = RETRY_INTERVAL,
        register_timeout: float = registering.REGISTER_TIMEOUT,
        register_retry: float = registering.RETRY_INTERVAL,
        mps: MpsSupervisor | None = None,
    ) -> None:
        self.root = root
        self.mps = mps or MpsSupervisor(MpsControl(root))
        """The MPS control daemons of the config in force."""
        if not isinstance(config, PluginConfigs):
            config = PluginConfigs.single(config)
        self._configs = config
        self._reload = reload
        self._selection = selecting.select(self._configs, None)
        self.health = HealthBook(self.config.health.ignored_xids)
        self.directory = root.join(constants.DEVICE_PLUGIN_DIR)
        self._nvml = nvml
        self._metrics = metrics
        self._readiness = readiness or (lambda ready, reason: None)
        self._retry_interval = retry_interval
        self._paused: set[Component] = set()
        self._session = False
        self._stale = True
        """The GPU inventory must be read (again) when NVML may be used."""
        self._inventory = inventory.EMPTY
        self._gpus = GpuPlan(())
        self._gpu_problem: str | None = None
        self._rdma: tuple[rdma.RdmaResource, ...] = ()
        self._servers: dict[str, PluginServer] = {}
        self._lock = asyncio.Lock()
        self._registration_problem: str | None = "starting"
        self.advertise_gpus = True
        """Whether the GPUs are served through the device plugin API; False while the node
        serves them through DRA (`dra.switching`): `nvidia.com/gpu` is then advertised with
        no device and no MPS daemon runs. Set before `run`, then through
        `set_advertise_gpus`."""
        self._registrar = registering.Registrar(
            self.directory,
            lambda: list(self._servers.values()),
            metrics,
            status=self._registered,
            timeout=register_timeout,
            retry_interval=register_retry,
        )
        metrics.config_in_force(self._selection.name)

    @property
    def config(self) -> DevicePluginConfig:
        """The config in force."""
        return self._selection.config

    @property
    def selection(self) -> selecting.Selection:
        """Which config is in force, and for which label value."""
        return self._selection

    @property
    def paused(self) -> frozenset[Component]:
        """Driver stacks whose devices are paused."""
        return frozenset(self._paused)

    @property
    def gpu_inventory(self) -> inventory.GpuInventory:
        """The GPUs and MIG devices last read (kept while paused)."""
        return self._inventory

    @property
    def gpu_session_open(self) -> bool:
        """Whether NVML is held open."""
        return self._session

    async def restore(self, paused: Iterable[Component], health: Iterable[HealthRecord]) -> None:
        """Take in the node's history: the driver stacks its commands leave paused, and its
        health events and driver validations in stream order. Before `run` (so NVML is never
        opened in the middle of a reload), or late, when the log could not be read at start:
        applying history again leaves the same state."""
        async with self._lock:
            for event in health:
                if isinstance(event, device.DeviceHealthChanged):
                    self.health.apply(event)
                elif event.component is Component.GPU:
                    self.health.reset()
            if set(paused) - self._paused:
                await self._pause(paused)
            await self._advertise()

    async def run(self, stopping: asyncio.Event) -> None:
        """Serve and stay registered until `stopping` is set; then stop every server and
        let go of NVML."""
        try:
            async with self._lock:
                await self._read_rdma()
                await self._read_gpus()
                await self._advertise()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._registrar.run(stopping), name="device-plugin-registrar")
                group.create_task(self._retry_loop(stopping), name="device-plugin-nvml-retry")
                group.create_task(self._mps_loop(stopping), name="device-plugin-mps")
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop serving (removing the sockets), quit the MPS daemons and close NVML."""
        for server in self._servers.values():
            await server.stop()
        async with self._lock:
            await self.mps.apply((), "the device plugin stops")
        if self._session:
            await asyncio.to_thread(self._close_session)

    async def device_health(self, event: device.DeviceHealthChanged) -> None:
        """Apply one health event of this node."""
        async with self._lock:
            if not self.health.apply(event):
                return
            known = {gpu.whole.gpu_uuid for gpu in self._inventory.gpus}
            if known and event.gpu_uuid not in known:
                log.info("%s is not a GPU of this node as last read", event.gpu_uuid)
            await self._advertise()

    async def driver_validated(self, component: Component) -> None:
        """A (re)loaded driver was validated: its devices are trusted and read anew."""
        async with self._lock:
            if component is Component.GPU:
                self.health.reset()
                self._stale = True
                await self._read_gpus()
            else:
                await self._read_rdma()
            await self._advertise()

    async def pause(self, components: Iterable[Component]) -> None:
        """Advertise the devices of `components` Unhealthy; close NVML for the GPU driver."""
        async with self._lock:
            await self._pause(components)
            await self._advertise()

    async def resume(self) -> None:
        """Use the devices again: NVML and the HCAs read anew, everything advertised."""
        async with self._lock:
            resumed, self._paused = self._paused, set()
            if Component.OFED in resumed:
                await self._read_rdma()
            await self._read_gpus()
            await self._advertise()

    async def set_advertise_gpus(self, advertise: bool) -> None:
        """Serve the GPUs through the device plugin API, or stop (`advertise_gpus`)."""
        async with self._lock:
            if advertise == self.advertise_gpus:
                return
            self.advertise_gpus = advertise
            if not self._stale:
                await self._plan_gpus()
            await self._advertise()

    async def select(self, requested: str | None) -> selecting.Selection:
        """Run the config the node's label `requested` selects (None: no label), reading
        the `--config` file again first; re-advertise when the config in force changes.
        Returns the answer: a `refused` one, with the config in force unchanged, when the
        file no longer validates."""
        async with self._lock:
            configs = self._configs
            if self._reload is not None:
                try:
                    configs = await asyncio.to_thread(self._reload)
                except SettingsError as error:
                    answer = selecting.refused(self._selection, requested, str(error))
                    log.error(
                        "refusing the switch to config %s, %s stays: %s",
                        requested or "(default)",
                        self._selection.name,
                        error,
                    )
                    self._metrics.config_selection(answer.outcome)
                    return answer
            self._configs = configs
            previous, answer = self._selection, selecting.select(configs, requested)
            self._selection = answer
            self._metrics.config_selection(answer.outcome)
            self._metrics.config_in_force(answer.name)
            if answer.problem:
                log.warning("%s: running the default config %s", answer.problem, answer.name)
            if answer.config == previous.config:
                return answer
            log.info("device plugin config %s -> %s", previous.name, answer.name)
            await self._reconfigure(previous.config)
            await self._advertise()
            return answer

    # Internals; every one runs with the lock held.

    async def _reconfigure(self, previous: DevicePluginConfig) -> None:
        """Plan every resource anew for the config now in force."""
        config = self.config
        self.health.ignored_xids = frozenset(config.health.ignored_xids)
        if config.rdma != previous.rdma:
            await self._read_rdma()
        if not self._stale:  # else the next read plans with the new config
            await self._plan_gpus()

    async def _pause(self, components: Iterable[Component]) -> None:
        self._paused |= set(components)
        if Component.GPU in self._paused:
            self._stale = True
            await self.mps.apply((), "the GPU driver is paused for a reload")
            if self._session:
                await asyncio.to_thread(self._close_session)

    async def _read_gpus(self) -> None:
        if Component.GPU in self._paused or not self._stale:
            return
        try:
            found = await asyncio.to_thread(self._open_and_read)
        except NvmlError as error:
            problem = f"NVML cannot be used: {error}"
            if problem != self._gpu_problem:  # once per failure, not once per retry
                log.warning("%s; retrying every %g s", problem, self._retry_interval)
            self._gpu_problem = problem
            return
        self._inventory, self._stale = found, False
        await self._plan_gpus()

    async def _plan_gpus(self) -> None:
        """The GPU resources of the inventory last read, under the config in force."""
        found = self._inventory
        self._gpus = gpu_resources(found, self.config)
        self._gpu_problem = self._gpus.problem
        if not self.advertise_gpus:
            await self.mps.apply((), "the node's GPUs are served through DRA")
        elif Component.GPU not in self._paused:
            reason = f"the GPUs or their sharing changed (config {self._selection.name})"
            await self.mps.apply(mps_daemons(self._gpus), reason)
        if self._gpu_problem:
            log.error("%s: advertising no MIG device", self._gpu_problem)
        flags = self.config.flags.plugin.resolved(cdi_ready=bool(found.cdi_names))
        if DeviceListStrategy.CDI in flags.device_list_strategy:
            try:
                path = await asyncio.to_thread(cdi.write_spec, self.root, found)
                log.info("CDI spec for %d GPUs at %s", len(found.gpus), path)
            except OSError as error:
                log.error("cannot write the CDI spec: %s", error)
        log.info(
            "%d GPUs under config %s: %s",
            len(found.gpus),
            self._selection.name,
            ", ".join(f"{r.name} ({len(r.devices)})" for r in self._gpus.resources) or "nothing",
        )

    async def _read_rdma(self) -> None:
        if Component.OFED in self._paused:
            return
        entries = self.config.rdma.config_list
        try:
            self._rdma = await asyncio.to_thread(rdma.rdma_resources, self.root, entries)
        except HostError as error:
            log.error("cannot read the host's RDMA devices, keeping the last read: %s", error)

    def _open_and_read(self) -> inventory.GpuInventory:
        self._nvml.init()
        self._session = True
        try:
            return inventory.read_inventory(self._nvml, self.root)
        except BaseException:
            self._close_session()
            raise

    def _close_session(self) -> None:
        self._nvml.shutdown()
        self._session = False

    async def _advertise(self) -> None:
        """Serve every resource with its devices' health now; new resources get a server."""
        gpus = self._gpus.resources if self.advertise_gpus else ()
        listed: list[Resource] = [*gpus, *self._rdma]
        resources = {resource.name: resource for resource in listed}
        for name, server in self._servers.items():
            if name not in resources:
                await server.advertise(VacantResource(name, server.resource.component), ())
        for name, resource in resources.items():
            devices = self._device_list(resource)
            if name in self._servers:
                await self._servers[name].advertise(resource, devices)
                continue
            server = PluginServer(resource, devices, self.directory, self._metrics)
            await server.start()
            self._servers[name] = server
            self._metrics.advertised(name, devices)
        self._report()

    def _device_list(self, resource: Resource) -> tuple[api_pb2.Device, ...]:
        paused = resource.component in self._paused or self._mps_down(resource.name)
        return tuple(
            api_pb2.Device(
                ID=d.id,
                health=constants.HEALTHY
                if not paused and (d.gpu_uuid is None or self.health.is_healthy(d.gpu_uuid))
                else constants.UNHEALTHY,
                topology=None
                if d.numa_node is None
                else api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa_node)]),
            )
            for d in resource.devices
        )

    def _mps_down(self, name: str) -> bool:
        """Whether `name` is MPS-shared and its daemon does not run."""
        return any(
            r.name == name and r.mps is not None and not self.mps.running(name)
            for r in self._gpus.resources
        )

    async def _mps_loop(self, stopping: asyncio.Event) -> None:
        """Check the MPS daemons; re-advertise when one fails or runs again."""
        while not await waiting.stopped_within(stopping, self.mps.check_interval):
            async with self._lock:
                if await self.mps.check():
                    await self._advertise()

    async def _retry_loop(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await waiting.stopped_within(stopping, self._retry_interval)
            if self._stale and Component.GPU not in self._paused and not stopping.is_set():
                async with self._lock:
                    await self._read_gpus()
                    await self._advertise()

    def _registered(self, problem: str | None) -> None:
        self._registration_problem = problem
        self._report()

    def _report(self) -> None:
        problem = self._registration_problem
        if problem is None and Component.GPU not in self._paused:
            problem = self._gpu_problem or self.mps.problem
        self._readiness(problem is None, problem or "")
