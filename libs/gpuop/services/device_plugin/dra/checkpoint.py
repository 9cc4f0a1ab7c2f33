"""The claims this node's DRA plugin prepared, kept on the host across plugin restarts.

The kubelet asks again to prepare a claim after it restarts, and may ask to unprepare one at
a plugin instance that never saw it, so the plugin must know, after any restart, what it
made: `<host root>/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json` (NVIDIA's
driver's place and states, its own JSON), replaced atomically on every change:

    {"bootId": ..., "preparedClaims": {<uid>: {"state": "PrepareStarted" | "PrepareCompleted",
     "namespace", "name", "devices": [{"requestNames", "poolName", "deviceName",
     "cdiDeviceIds"}], "sharing": {<request>: <strategy or null>}, "startedAt": <ISO time>}}}

`PrepareStarted` is written before anything else for a claim and `PrepareCompleted` after
its CDI spec, so a plugin that dies in between finds the claim half made and rolls it back
before preparing it again (`preparing`), or sweeps it when the kubelet never asks again
(`Preparer.sweep`). A checkpoint of another boot is discarded whole:
`/var/run/cdi` is tmpfs and the containers it served are gone. An unreadable checkpoint is
an error (`CheckpointError`) rather than an empty one: forgetting prepared claims would hand
their GPUs out twice.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpuop.host.files import write_atomic

log = logging.getLogger(__name__)

FILE = "checkpoint.json"


class CheckpointError(RuntimeError):
    """The checkpoint exists but cannot be read; the message names the file and why."""


class State(StrEnum):
    STARTED = "PrepareStarted"
    """Prepare began; the CDI spec may or may not be written."""
    COMPLETED = "PrepareCompleted"
    """The claim's CDI spec is written; its devices were answered."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answered it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "requestNames": list(self.request_names),
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "cdiDeviceIds": list(self.cdi_device_ids),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedDevice:
        return cls(
            tuple(data["requestNames"]),
            str(data["poolName"]),
            str(data["deviceName"]),
            tuple(data["cdiDeviceIds"]),
        )


@dataclass(frozen=True)
class PreparedClaim:
    state: State
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...] = ()
    sharing: dict[str, str | None] = field(default_factory=dict)
    started_at: datetime | None = None
    """When its prepare began; None in a checkpoint written before gpuop recorded it."""

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "state": str(self.state),
            "namespace": self.namespace,
            "name": self.name,
            "devices": [device.to_json() for device in self.devices],
            "sharing": self.sharing,
        }
        if self.started_at is not None:
            document["startedAt"] = self.started_at.isoformat()
        return document

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedClaim:
        return cls(
            State(data["state"]),
            str(data["namespace"]),
            str(data["name"]),
            tuple(PreparedDevice.from_json(d) for d in data.get("devices", ())),
            dict(data.get("sharing", {})),
            datetime.fromisoformat(data["startedAt"]) if data.get("startedAt") else None,
        )


class Checkpoint:
    """The prepared claims of this boot, by claim uid, written through to `path`."""

    def __init__(self, path: Path, boot_id: str | None) -> None:
        self.path = path
        self._boot_id = boot_id
        self._claims: dict[str, PreparedClaim] = {}

    @classmethod
    def load(cls, path: Path, boot_id: str | None) -> Checkpoint:
        """The checkpoint at `path`; empty when there is none or it is of another boot."""
        checkpoint = cls(path, boot_id)
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return checkpoint
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot read the DRA checkpoint {path}: {error}") from None
        if data.get("bootId") != boot_id:
            log.info("%s is of boot %s, not %s: discarded", path, data.get("bootId"), boot_id)
            return checkpoint
        try:
            checkpoint._claims = {
                str(uid): PreparedClaim.from_json(claim)
                for uid, claim in data["preparedClaims"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(f"the DRA checkpoint {path} is malformed: {error!r}") from None
        return checkpoint

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def claims(self) -> dict[str, PreparedClaim]:
        return dict(self._claims)

    def put(self, uid: str, claim: PreparedClaim) -> None:
        self._claims[uid] = claim
        self._save()

    def remove(self, uid: str) -> None:
        if self._claims.pop(uid, None) is not None:
            self._save()

    def _save(self) -> None:
        document = {
            "bootId": self._boot_id,
            "preparedClaims": {uid: c.to_json() for uid, c in sorted(self._claims.items())},
        }
        write_atomic(self.path, json.dumps(document, indent=2) + "\n")
