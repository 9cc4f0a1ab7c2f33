"""Kubernetes Events about what the operator does to nodes.

Called by the upgrade orchestrator when a node's upgrade starts, ends, reboots or rolls back
(`gpuop.saga.upgrade.drafting.RECORDED_STATES`; upstream records one at every state change, with
reason `GPUDriverUpgrade` or `OFEDDriverUpgrade`), so that `kubectl describe node` and
`kubectl get events` tell the rollout's story next to the kubelet's own events. Events are
core/v1, written as client-go's record package writes them: in namespace `default` (a node
has none), `involvedObject` the node (kind, name, uid), `source.component` and
`reportingComponent` the operator (`gpuop`), one event per call (`count: 1`). An Event is a
record, not a state: callers that must not fail because of one catch `KubeError`.
"""

from __future__ import annotations

import socket
from enum import StrEnum
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import errors, nodes
from gpuop.kube.client import Kube

Obj = dict[str, Any]

COMPONENT = "gpuop"
MAX_MESSAGE = 1024
"""Longer messages are cut: the API server rejects Events with very long notes."""


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


def upgrade_reason(driver: str) -> str:
    """The reason upstream records for `driver`'s upgrade steps: `GPUDriverUpgrade`."""
    return f"{driver.upper()}DriverUpgrade"


class EventRecorder:
    """Writes Events for one reporting component instance."""

    def __init__(
        self,
        kube: Kube,
        *,
        component: str = COMPONENT,
        instance: str | None = None,
        namespace: str = "default",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance or socket.gethostname()
        self.namespace = namespace
        self.clock = clock

    async def node_event(
        self,
        node: str,
        reason: str,
        message: str,
        *,
        event_type: EventType = EventType.NORMAL,
        action: str | None = None,
        node_uid: str | None = None,
    ) -> Obj:
        """Record an Event about `node` and return it as written. The node's uid is read
        when not given, so that `kubectl describe node` finds the event."""
        if node_uid is None:
            try:
                node_uid = (await nodes.get(self.kube, node))["metadata"].get("uid")
            except errors.NotFound:
                node_uid = None  # a node already gone still gets its record
        now = self.clock.now()
        timestamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: Obj = {"apiVersion": "v1", "kind": "Node", "name": node}
        if node_uid:
            involved["uid"] = node_uid
        event: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            # client-go's naming: the object's name and the time in hex nanoseconds.
            "metadata": {
                "name": f"{node}.{int(now.timestamp() * 1e9):x}",
                "namespace": self.namespace,
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "type": str(event_type),
            "source": {"component": self.component, "host": self.instance},
            "firstTimestamp": timestamp,
            "lastTimestamp": timestamp,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        if action is not None:
            event["action"] = action
        try:
            return await self._create(event)
        except errors.AlreadyExists:
            # Two events in the same nanosecond (a virtual clock): let the server name it.
            event["metadata"] = {"generateName": f"{node}.", "namespace": self.namespace}
            return await self._create(event)

    async def _create(self, event: Obj) -> Obj:
        return await self.kube.call(self.kube.core.create_namespaced_event, self.namespace, event)
