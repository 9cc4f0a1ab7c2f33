"""The device-API switch's public face: a node's switch started, and each move it makes.

The upgrade orchestrator publishes these, and only it, in the domain `device-api` (the
command the saga sends and its answer are the device plugin's,
`gpuop.events.device_api_commands`). A switch starts when the policy's `deviceAPI` for a
node (`devicePlugin` or `dra`, at the top of the policy or its driver pool's) differs from
what the node's device plugin last said it serves (`DeviceApiApplied`), or when the node has
said nothing yet and the policy wants `dra`. `NodeDeviceApiStateChanged` goes out on every
move, on the subject `gpuop.evt.device-api.<node>.<state>` named after the new state, as the
other kinds' moves do (`gpuop.evt.device-api.*.device-api-failed`).
`DeviceApiSwitchStarted` records what the saga was started with (the API wanted, the one the
node served, the validation pod), so `gpuop replay` builds the same saga without the node
labels or the device plugin's history.
"""

from __future__ import annotations

from typing import ClassVar

from gpuop.events.device_api_commands import DeviceApi
from gpuop.events.envelope import Event, StateChangedEvent
from gpuop.events.fields import Attempt, CorrelationId, DocumentedEnum, Message

DOMAIN = "device-api"


class DeviceApiState(DocumentedEnum):
    """Where one node's switch of kubelet API stands: the action still pending."""

    SWITCH_REQUIRED = "device-api-switch-required"
    """The policy wants another API for the node; waits for a slot -> cordon."""
    CORDON_REQUIRED = "cordon-required"
    """Admitted; the node is to be made unschedulable -> drain."""
    DRAIN_REQUIRED = "drain-required"
    """Cordoned; the pods holding its GPUs (either API's) are to be evicted -> api-switch."""
    API_SWITCH_REQUIRED = "api-switch-required"
    """The device plugin is to serve the new API and say so -> validation, or switch-back."""
    VALIDATION_REQUIRED = "validation-required"
    """A pod given a GPU through the new API is to succeed -> uncordon, or switch-back."""
    SWITCH_BACK_REQUIRED = "switch-back-required"
    """A step failed after the switch: the API of the start is to be served -> uncordon."""
    UNCORDON_REQUIRED = "uncordon-required"
    """The node is to be schedulable again (unless cordoned before) -> done, or failed."""
    DONE = "device-api-done"
    """The node serves its GPUs through the API the policy wants; final."""
    FAILED = "device-api-failed"
    """The switch failed with its reason; final (the next difference starts a new one)."""


TERMINAL_STATES = frozenset({DeviceApiState.DONE, DeviceApiState.FAILED})
"""States in which a switch takes no further action."""


class DeviceApiSwitchStarted(Event):
    """The orchestrator started switching a node's kubelet API: recorded so a replay builds
    the same saga."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "started"

    saga_id: CorrelationId
    """The switch (also the envelope's `correlationid`)."""
    api: DeviceApi
    """The API the node is to serve."""
    previous: DeviceApi
    """The API the node served at the start (what a failure switches back to): its device
    plugin's latest `DeviceApiApplied`, the device plugin API when it has said nothing."""
    reason: Message = ""
    """Why, in words (the policy's value, the pool)."""


class NodeDeviceApiStateChanged(StateChangedEvent):
    """A node's device-API switch moved to a new state; published on that state's subject."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "state-changed"

    saga_id: CorrelationId
    """The switch (also the envelope's `correlationid`)."""
    api: DeviceApi
    """The API the switch is to serve."""
    from_state: DeviceApiState | None = None
    """State before the change."""
    to_state: DeviceApiState
    """State after the change: the last token of the subject."""
    reason: Message = ""
    """Why the saga moved, in words."""
    attempt: Attempt = 1
    """The switch's attempt."""
