"""Prepare and unprepare claims: the work behind NodePrepareResources and
NodeUnprepareResources, without gRPC (`serving` answers the kubelet with it).

Both are idempotent and answer per claim, as the kubelet requires: one claim's error never
fails the others.

    prepare   a claim prepared already (`PrepareCompleted`): the answer it got, again,
              nothing written. Half prepared (`PrepareStarted`, the plugin died): its spec
              removed first, then prepared anew. Otherwise: its allocation from the
              claims index (unknown: "allocation not yet known", the kubelet retries on its
              next pod sync); its sharing decoded (`sharing`; what cannot apply is the
              claim's error); each of gpuop's devices matched to a GPU or MIG device of the
              inventory by UUID, and refused when another prepared claim holds it without
              admin access; `PrepareStarted`, the CDI spec (`cdispecs`), `PrepareCompleted`.
    unprepare the claim's spec removed and its checkpoint entry dropped; a claim never
              prepared here succeeds (the kubelet may ask any instance).
    sweep     every `SWEEP_INTERVAL` seconds: a claim half prepared (`PrepareStarted`, the
              plugin died mid-prepare) at least `SWEEP_AFTER` ago whose allocation on this
              node the claim facts no longer hold (released or deleted: the kubelet will
              never ask about it again) is unprepared, its CDI spec removed. NVIDIA's
              driver does the same every 10 minutes, asking the API server whether the
              claim still exists; gpuop's node asks the facts it reads from the bus, once
              it has read every one the log held.

Devices of other drivers in the allocation are left to them. Called under one lock by
`serving.DraServer`, so two kubelet calls never interleave on the checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import dra
from gpuop.host.roots import HostRoot
from gpuop.inventory.claims import ClaimHolders
from gpuop.services.device_plugin.dra import cdispecs, sharing
from gpuop.services.device_plugin.dra.checkpoint import (
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    State,
)
from gpuop.services.device_plugin.inventory import GpuInventory, Target

log = logging.getLogger(__name__)

NOT_YET_KNOWN = "allocation not yet known"
"""The start of the error for a claim whose `ClaimAllocated` has not reached the node."""


SWEEP_INTERVAL = 600.0
"""Seconds between two sweeps of half-prepared claims (NVIDIA's driver's 10 minutes)."""
SWEEP_AFTER = timedelta(seconds=SWEEP_INTERVAL)
"""How old a half-prepared claim must be to be swept: a prepare in flight never is."""


class PrepareError(Exception):
    """This claim cannot be prepared; the message is the claim's error for the kubelet."""


@dataclass(frozen=True)
class ClaimName:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


Prepared = tuple[PreparedDevice, ...] | PrepareError
"""A claim's answer: its devices, or why not."""


class Preparer:
    """Prepares this node's claims from the index, into the checkpoint."""

    def __init__(
        self,
        root: HostRoot,
        index: ClaimHolders,
        checkpoint: Checkpoint,
        inventory: Callable[[], GpuInventory],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.root = root
        self.index = index
        self.checkpoint = checkpoint
        self._inventory = inventory
        self._clock = clock

    def prepare(self, claim: ClaimName) -> Prepared:
        """The claim's devices, or a `PrepareError` saying why not (returned, not raised)."""
        try:
            return self._prepare(claim)
        except PrepareError as error:
            log.warning("cannot prepare claim %s: %s", claim, error)
            return error
        except OSError as error:
            log.error("cannot prepare claim %s: %s", claim, error)
            return PrepareError(f"cannot write the claim's CDI spec: {error}")

    def unprepare(self, uid: str) -> str:
        """Undo what prepare made for the claim; the claim's error, empty on success."""
        try:
            cdispecs.remove(self.root, uid)
            self.checkpoint.remove(uid)
        except OSError as error:
            log.error("cannot unprepare claim %s: %s", uid, error)
            return f"cannot remove the claim's CDI spec or checkpoint entry: {error}"
        return ""

    def sweep(self) -> tuple[str, ...]:
        """Unprepare the stale half-prepared claims (see the module docstring); the uids
        swept. Nothing before every claim fact the log held was read: a claim not known
        yet is not a claim gone."""
        if not self.index.ready.is_set():
            return ()
        now = self._clock.now()
        swept: list[str] = []
        for uid, claim in sorted(self.checkpoint.claims().items()):
            if claim.state is not State.STARTED or self.index.get(uid) is not None:
                continue
            if claim.started_at is not None and now - claim.started_at < SWEEP_AFTER:
                continue
            error = self.unprepare(uid)
            if error:
                log.warning("cannot sweep half-prepared claim %s (next sweep): %s", uid, error)
                continue
            log.info(
                "swept claim %s/%s (%s): half prepared, and no longer allocated here",
                claim.namespace, claim.name, uid,
            )  # fmt: skip
            swept.append(uid)
        return tuple(swept)

    def _prepare(self, claim: ClaimName) -> tuple[PreparedDevice, ...]:
        known = self.checkpoint.get(claim.uid)
        if known is not None and known.state is State.COMPLETED:
            return known.devices
        if known is not None:
            log.info("claim %s was half prepared by an earlier run: rolling back", claim)
            self.unprepare(claim.uid)
        allocation = self.index.get(claim.uid)
        if allocation is None:
            raise PrepareError(
                f"{NOT_YET_KNOWN}: no allocation of claim {claim} for this node reached its "
                "plugin yet (the device plugin's cluster role publishes it)"
            )
        ours = [d for d in allocation.devices if d.driver == dra.DRIVER]
        if not ours:
            raise PrepareError(f"claim {claim} has no device of driver {dra.DRIVER} here")
        requests = [device.request for device in ours]
        try:
            shared = sharing.sharing_by_request(allocation.configs, requests)
        except sharing.SharingError as error:
            raise PrepareError(str(error)) from None
        targets = [self._target(device) for device in ours]
        self._check_free(claim.uid, ours)
        strategies = {r: (str(s) if s else None) for r, s in shared.items()}
        started = PreparedClaim(
            State.STARTED, claim.namespace, claim.name, sharing=strategies,
            started_at=self._clock.now(),
        )  # fmt: skip
        self.checkpoint.put(claim.uid, started)
        cdispecs.write(
            self.root,
            claim.uid,
            [(d.device, target.device_nodes) for d, target in zip(ours, targets, strict=True)],
        )
        devices = tuple(
            PreparedDevice(
                (device.request.partition("/")[0],),
                device.pool,
                device.device,
                (cdispecs.qualified_name(claim.uid, device.device),),
            )
            for device in ours
        )
        completed = PreparedClaim(
            State.COMPLETED, claim.namespace, claim.name, devices, strategies, started.started_at
        )
        self.checkpoint.put(claim.uid, completed)
        log.info("prepared claim %s: %s", claim, ", ".join(d.device_name for d in devices))
        return devices

    def _target(self, device: dra.AllocatedDevice) -> Target:
        wanted = device.mig_uuid or device.gpu_uuid
        if wanted is None:
            raise PrepareError(
                f"device {device.pool}/{device.device} names no GPU of this node (no UUID in "
                "its allocation)"
            )
        for gpu in self._inventory().gpus:
            for target in (gpu.whole, *gpu.mig_devices):
                if target.uuid == wanted:
                    return target
        raise PrepareError(
            f"device {device.pool}/{device.device} is {wanted}, which this node's GPUs do not "
            "have (NVML not read yet, or the MIG layout changed)"
        )

    def _check_free(self, uid: str, devices: list[dra.AllocatedDevice]) -> None:
        held: dict[str, str] = {}
        for other_uid, other in self.checkpoint.claims().items():
            allocation = self.index.get(other_uid)
            if other_uid == uid or allocation is None:
                continue
            for device in allocation.devices:
                if not device.admin_access:
                    held[f"{device.pool}/{device.device}"] = f"{other.namespace}/{other.name}"
        for device in devices:
            holder = held.get(f"{device.pool}/{device.device}")
            if holder is not None and not device.admin_access:
                raise PrepareError(
                    f"device {device.pool}/{device.device} is prepared for claim {holder} already"
                )
