"""A node's `nvidia.com/mig.config` label, told to the MIG reconfiguration saga.

Upstream's MIG manager watches its own Node for the label `nvidia.com/mig.config`, which
names a config of mig-parted's file. gpuop's node agents hold no Kubernetes credentials, so
discovery's cluster role, which watches the Nodes for `nvidia.com/device-plugin.config`
already (`device.DevicePluginConfigSelected`), publishes `MigConfigRequested` on the node's
subject whenever the label is set, changed or removed. The upgrade orchestrator starts the
node's MIG saga from it (`gpuop.saga.mig`), or queues it behind the one running.
"""

from __future__ import annotations

from typing import ClassVar

from gpuop.events.envelope import Event
from gpuop.events.fields import LabelValue

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""The Node label that names the MIG config a node should have, as upstream's."""


class MigConfigRequested(Event):
    """The node's `nvidia.com/mig.config` label changed (published by discovery's cluster
    role, which watches the Nodes)."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "mig-config-requested"

    config: LabelValue | None = None
    """The label's value, the config name; None when the node has no such label (its MIG
    layout is left as it is)."""
