"""Who may do what on the bus, in the domain's words: which service owns which events, who
commands, who writes which bucket. The permission tests hold deploy/nats/accounts.conf to
this, so the two are written independently of each other."""

from __future__ import annotations

import hashlib

from gpuop.bus.protocol import Buckets
from gpuop.events import (
    Command,
    Envelope,
    Event,
    Payload,
    bus_subject,
    device,
    device_api_commands,
    ids,
    mig_requests,
    new_command,
    new_event,
    remediation_commands,
    subjects,
)

PREFIX = "gpuop"
NODE = "gpu-1.example.com"
TOKEN = subjects.encode_node(NODE)
SERVICE_USERS = (
    "discovery",
    "discovery-cluster",
    "driver-manager",
    "device-plugin",
    "device-plugin-cluster",
    "network-manager",
    "network-manager-cluster",
    "telemetry",
    "telemetry-cluster",
    "upgrade-orchestrator",
)
ALL_USERS = (*SERVICE_USERS, "observer", "admin")
OPERAND_CONFIRMATIONS = (device.OperandPaused, device.OperandResumed)
KV_WRITERS = {
    Buckets.SAGAS: {"upgrade-orchestrator"},
    Buckets.NODES: {"discovery"},
    Buckets.CONFIG: {"network-manager-cluster"},
    Buckets.IPAM: {"network-manager"},
}


def may_publish(user: str, payload: type[Payload]) -> bool:
    """The domain's rule: a service publishes the events it owns; only the orchestrator
    commands; observer publishes nothing; admin anything."""
    if user == "admin":
        return True
    if issubclass(payload, Command):
        return user == "upgrade-orchestrator"
    assert issubclass(payload, Event)
    if payload in OPERAND_CONFIRMATIONS:
        return user in ("discovery", "device-plugin", "telemetry")
    owners = {
        "hardware": "discovery",
        "driver": "driver-manager",
        "network": "network-manager",
        "kube": "upgrade-orchestrator",
        "saga": "upgrade-orchestrator",
        "upgrade": "upgrade-orchestrator",
        "remediation": "upgrade-orchestrator",
        "mig": "upgrade-orchestrator",
        "dra": "device-plugin-cluster",  # claims' allocations: only it reads claims
    }
    if payload is device.DeviceHealthChanged:
        return user == "telemetry"
    if payload in (device.DevicePluginConfigSelected, mig_requests.MigConfigRequested):
        return user == "discovery-cluster"  # from the Node's labels, which only it watches
    if payload in (remediation_commands.GpuHoldersListed, remediation_commands.GpuHoldersUnknown):
        return user == "device-plugin"  # the holders of its node's GPUs, from its kubelet
    if payload in (
        device.DevicePluginConfigApplied,
        device.MpsDaemonChanged,
        device_api_commands.DeviceApiApplied,
    ):
        return user == "device-plugin"
    return owners[payload.DOMAIN] == user


def envelope_of(payload: Payload) -> Envelope:
    if isinstance(payload, Command):
        # two samples of one verb (a GPU and an OFED validation) are two commands, two ids
        digest = hashlib.sha256(payload.model_dump_json().encode()).hexdigest()[:12]
        ident = ids.step("saga/gpu-1/1", f"test/{payload.VERB}/{digest}", 1)
        return new_command(payload, node=NODE, source="/test", id=ident)
    assert isinstance(payload, Event)
    return new_event(payload, node=NODE, source="/test")


def subject_of(payload: Payload) -> str:
    return bus_subject(envelope_of(payload), prefix=PREFIX)
