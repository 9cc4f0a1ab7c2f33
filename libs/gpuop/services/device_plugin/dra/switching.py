"""Which kubelet API the node's GPUs are served through, and the switch between them.

`DeviceApiSwitch` is driven by `agent.NodeAgent`: at start it serves the API kept on the
host (`deviceapis`), and `SetDeviceApi` switches (the choice written first, so a plugin
that dies halfway serves the new API when it is back):

    dra             `nvidia.com/gpu` advertised with no device (the kubelet's allocatable
                    drops to 0, and the DeviceClass's extended-resource mapping then serves
                    `nvidia.com/gpu` pods through DRA), the MPS daemons quit, the DRA plugin
                    served; the answer waits up to `register_wait` for the kubelet to
                    register the plugin
    device-plugin   the DRA plugin stopped (the kubelet wipes the node's slices 30 s later,
                    and the cluster role, reading this answer, does not publish them again),
                    the GPUs advertised again

Each answer is a `DeviceApiApplied` with `serving`: for DRA, whether the kubelet registered
the plugin. What changes on its own (the kubelet registering the plugin again after its
restart, or refusing it; the plugin stopping) is queued in `changes` for the agent to
publish without a command.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.services.device_plugin.dra import deviceapis
from gpuop.services.device_plugin.dra.checkpoint import CheckpointError
from gpuop.services.device_plugin.dra.plugin import DraPlugin
from gpuop.services.device_plugin.plugins import DevicePlugins

log = logging.getLogger(__name__)

REGISTER_WAIT = 10.0
"""Seconds an answer to `SetDeviceApi(dra)` waits for the kubelet's registration (it dials
a new socket in `plugins_registry` within a second or two)."""


class DeviceApiSwitch:
    """Serves the node's GPUs through one kubelet API at a time."""

    def __init__(
        self, plugins: DevicePlugins, dra: DraPlugin, *, register_wait: float = REGISTER_WAIT
    ) -> None:
        self._plugins = plugins
        self._dra = dra
        self._register_wait = register_wait
        self.api = deviceapis.load(plugins.root)
        """The API served (or being switched to)."""
        self.changes: deque[DeviceApiApplied] = deque()
        """What changed on its own, oldest first, for the agent to publish."""
        self.changed = asyncio.Event()
        """Set when `changes` gets one."""
        self._registered = asyncio.Event()
        self._heard = asyncio.Event()
        """Set by any word of the kubelet on the registration (cleared before a start)."""
        self._problem = "the kubelet has not registered the DRA plugin yet"
        self._answering = False
        self._lock = asyncio.Lock()
        plugins.advertise_gpus = self.api is DeviceApi.DEVICE_PLUGIN
        dra.on_registration = self.on_registration

    def on_registration(self, registered: bool, error: str) -> None:
        """The kubelet's word on the DRA plugin (given to the DRA server)."""
        if registered:
            self._registered.set()
        else:
            self._registered.clear()
            self._problem = f"the kubelet refused the DRA plugin: {error}"
        self._heard.set()
        if not self._answering:  # else the answer to the command reports it
            self._queue(self._now(registered))

    async def start(self) -> None:
        """Serve the API kept on the host, and queue the report of it."""
        async with self._lock:
            if self.api is DeviceApi.DRA:
                self._queue(await self._serve_dra(wait=False))
            else:
                self._queue(self._now(True))

    async def stop(self) -> DeviceApiApplied | None:
        """Stop the DRA plugin; what to report (None when it was not serving)."""
        async with self._lock:
            if not self._dra.serving:
                return None
            await self._dra.stop()
            return DeviceApiApplied(api=self.api, serving=False, message="the plugin stopped")

    async def apply(self, api: DeviceApi) -> DeviceApiApplied:
        """Serve `api` from now on; the answer."""
        async with self._lock:
            self._answering = True
            try:
                return await self._apply(api)
            finally:
                self._answering = False

    async def _apply(self, api: DeviceApi) -> DeviceApiApplied:
        if api != self.api:
            await asyncio.to_thread(deviceapis.save, self._plugins.root, api)
            log.info("serving the node's GPUs through %s instead of %s", api, self.api)
            self.api = api
        if api is DeviceApi.DRA:
            await self._plugins.set_advertise_gpus(False)
            return await self._serve_dra(wait=True)
        await self._dra.stop()
        self._registered.clear()
        await self._plugins.set_advertise_gpus(True)
        return self._now(True)

    async def _serve_dra(self, *, wait: bool) -> DeviceApiApplied:
        if not self._dra.serving:
            self._heard.clear()
        try:
            await self._dra.start()
        except (CheckpointError, OSError) as error:
            log.error("cannot serve the DRA plugin: %s", error)
            return DeviceApiApplied(api=DeviceApi.DRA, serving=False, message=str(error)[:2048])
        if wait:
            try:
                async with asyncio.timeout(self._register_wait):
                    await self._heard.wait()
            except TimeoutError:
                pass
        return self._now(self._registered.is_set())

    def _now(self, serving: bool) -> DeviceApiApplied:
        message = "" if serving else self._problem
        return DeviceApiApplied(api=self.api, serving=serving, message=message[:2048])

    def _queue(self, applied: DeviceApiApplied) -> None:
        self.changes.append(applied)
        self.changed.set()
