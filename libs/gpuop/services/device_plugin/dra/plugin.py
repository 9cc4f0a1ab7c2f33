"""The DRA kubelet plugin of one node: the claims it learnt, what it prepared, its servers.

`DraPlugin` is what the device plugin's node agent drives while the node's GPUs are served
through DRA: it reads the node's claims from the one `ClaimHolders` the agent keeps (fed by
`gpuop.inventory.claims.follow`, which the holders read too; kept while stopped, so a switch
to DRA finds the claims allocated before it), tells the kubelet's health streams when they
change (`watch_claims`), and `start` loads the checkpoint of this boot, then serves the
kubelet (`serving.DraServer`).
Device health comes from the device plugin's health book: every whole GPU of the inventory
(`gpu-<minor>`, the name the cluster role publishes) and every MIG device a claim holds,
healthy while its physical GPU is, and every one unhealthy while the GPU driver is paused
for a reload (as the device plugin API advertises them then).
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from pathlib import PurePosixPath

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import dra
from gpuop.host import system
from gpuop.host.roots import HostRoot
from gpuop.inventory.claims import ClaimHolders
from gpuop.runtime import waiting
from gpuop.services.device_plugin.dra import checkpoint, serving
from gpuop.services.device_plugin.dra.preparing import Preparer
from gpuop.services.device_plugin.dra.serving import DeviceHealth, DraServer, Registered
from gpuop.services.device_plugin.health import HealthBook
from gpuop.services.device_plugin.inventory import GpuInventory

PAUSED = "the GPU driver is paused for a reload"
_MINOR = re.compile(r"^/dev/nvidia(\d+)$")


def data_dir(kubelet_dir: str = serving.KUBELET_DIR) -> str:
    """The plugin's directory under the host root, beside its DRA socket."""
    return f"{kubelet_dir}/plugins/{dra.DRIVER}"


class DraPlugin:
    """One node's DRA kubelet plugin."""

    def __init__(
        self,
        root: HostRoot,
        node: str,
        inventory: Callable[[], GpuInventory],
        health: HealthBook,
        *,
        paused: Callable[[], bool] = lambda: False,
        on_registration: Registered | None = None,
        kubelet_dir: str = serving.KUBELET_DIR,
        seen_as: PurePosixPath = serving.HOST_ROOT,
        resend_interval: float = serving.RESEND_INTERVAL,
        clock: Clock | None = None,
        claims: ClaimHolders | None = None,
    ) -> None:
        self.root = root
        self.pool = node
        """gpuop's pool on this node is named after it."""
        self.index = claims if claims is not None else ClaimHolders()
        """The node's claims: the agent's one fold of their facts."""
        self._inventory = inventory
        self._health = health
        self._paused = paused
        self._checkpoint_path = root.join(f"{data_dir(kubelet_dir)}/{checkpoint.FILE}")
        self.on_registration: Registered = on_registration or (lambda registered, error: None)
        """Told the kubelet's word on every registration (replaceable before `start`)."""
        self._clock = clock or SYSTEM_CLOCK
        self._new_server = functools.partial(
            DraServer,
            root.path,
            on_registration=lambda registered, error: self.on_registration(registered, error),
            kubelet_dir=kubelet_dir,
            seen_as=seen_as,
            resend_interval=resend_interval,
            clock=clock,
        )
        self._server: DraServer | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.serving

    async def start(self) -> None:
        """Load this boot's checkpoint and serve the kubelet; a no-op when serving.
        Raises `checkpoint.CheckpointError` when the checkpoint cannot be read."""
        if self._server is not None:
            return
        boot = await asyncio.to_thread(system.boot_id, self.root)
        loaded = await asyncio.to_thread(checkpoint.Checkpoint.load, self._checkpoint_path, boot)
        preparer = Preparer(self.root, self.index, loaded, self._inventory, self._clock)
        server = self._new_server(preparer, self.devices_health)
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving; prepared claims stay in the checkpoint and their CDI specs stay,
        since their containers still run."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    async def watch_claims(self, stopping: asyncio.Event) -> None:
        """Tell the kubelet's health streams whenever the claims changed (the MIG devices
        they hold are among the devices reported), until `stopping` is set."""
        changed = self.index.changed
        while not stopping.is_set():
            await waiting.idle(None, wake=changed, stopping=stopping)
            await self.health_changed()

    async def health_changed(self) -> None:
        """Tell the kubelet's open health streams (a GPU's health or the devices changed)."""
        if self._server is not None:
            await self._server.health_changed()

    def devices_health(self) -> list[DeviceHealth]:
        """Every device's health: the whole GPUs, and the MIG devices claims hold."""
        unhealthy = self._health.unhealthy
        paused = PAUSED if self._paused() else None
        found: dict[str, DeviceHealth] = {}

        def add(device: str, gpu_uuid: str) -> None:
            why = paused or unhealthy.get(gpu_uuid)
            found[device] = DeviceHealth(self.pool, device, why is None, why or "")

        for gpu in self._inventory().gpus:
            minor = _MINOR.match(gpu.whole.device_nodes[0]) if gpu.whole.device_nodes else None
            if minor is not None:
                add(f"gpu-{minor.group(1)}", gpu.whole.gpu_uuid)
        for allocation in self.index.allocations():
            for device in allocation.devices:
                ours = device.driver == dra.DRIVER and device.pool == self.pool
                if ours and device.gpu_uuid is not None:
                    add(device.device, device.gpu_uuid)
        return [found[name] for name in sorted(found)]
