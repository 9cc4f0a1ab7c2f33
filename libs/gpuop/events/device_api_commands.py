"""Which kubelet API serves a node's GPUs: `SetDeviceApi` to its device plugin, and the answer.

A node serves its GPUs through the device plugin API (`nvidia.com/gpu` in the node's
allocatable) or through Dynamic Resource Allocation (a DRA kubelet plugin, and
ResourceSlices that the device plugin's cluster role writes), never both at once: the
policy's `deviceAPI` chooses, and the device-API saga switches a node after draining its GPU
pods. The saga sends `SetDeviceApi` to the node's device plugin, which stops serving one API,
starts the other, and answers with `DeviceApiApplied` once the kubelet accepted the plugin
(or with `serving` false and the reason). The device plugin also publishes
`DeviceApiApplied` without a command whenever what it serves changes on its own: at start,
when the kubelet restarts and registers it again, when the plugin stops. The cluster role
publishes a node's ResourceSlices while its latest answer says `dra` and `serving`, and
leaves them to the kubelet's wipe otherwise.
"""

from __future__ import annotations

from typing import ClassVar

from gpuop.events.envelope import Command, Event
from gpuop.events.fields import DocumentedEnum, Message, MessageId

DEVICE_PLUGIN = "device-plugin"
"""The service that executes `SetDeviceApi`."""


class DeviceApi(DocumentedEnum):
    """The kubelet API a node's GPUs are served through (the policy's `deviceAPI`, which
    spells them `devicePlugin` and `dra`, as Kubernetes APIs spell values)."""

    DEVICE_PLUGIN = "device-plugin"
    """The device plugin API: `nvidia.com/gpu` in the node's allocatable."""
    DRA = "dra"
    """Dynamic Resource Allocation: slices of driver `gpu.nvidia.com`, gpuop's kubelet plugin."""


class SetDeviceApi(Command):
    """Serve the node's GPUs through `api` from now on (and only through it)."""

    SERVICE: ClassVar[str] = DEVICE_PLUGIN
    VERB: ClassVar[str] = "set-device-api"

    api: DeviceApi
    """The API to serve."""
    reason: Message = ""
    """Why, for the log."""


class DeviceApiApplied(Event):
    """What the node's device plugin serves now, and whether the kubelet accepted it."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "api-applied"

    api: DeviceApi
    """The API the plugin serves."""
    serving: bool
    """True once the kubelet registered the plugin for `api`; False while it is not
    registered (starting, the kubelet restarting, or it refused the plugin: see `message`)."""
    command_id: MessageId | None = None
    """Envelope id of the `SetDeviceApi` this answers; None when it reports a change of its
    own (start, kubelet restart)."""
    message: Message = ""
    """Detail for operators: why the plugin is not serving."""
