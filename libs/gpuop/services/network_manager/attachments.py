"""One Multus `NetworkAttachmentDefinition` (`k8s.cni.cncf.io/v1`) per secondary network:
what it says (`attachment`), and making the cluster's match the policy (`reconcile`).

Called by `controller.NetworkController` on every pass. A network's attachment lives in
the network's namespace under its name, so pods join it with the annotation
`k8s.v1.cni.cncf.io/networks: <namespace>/<name>`. Its CNI configuration stacks the pod's
interface on the link gpuop made for the network on every node (`link_name`), not on the
NIC itself: the kernel puts a macvlan or ipvlan stacked on another one on the same NIC, and
the link has the same name on every node whichever NIC the selectors picked there. Pods
get their addresses from `whereabouts` over the network's subnet, without the node range,
the gateway and the exclusions, so they never collide with the nodes' addresses.

gpuop labels what it writes (`MANAGED_BY_LABEL`, `NETWORK_LABEL`) and only ever changes or
deletes attachments so labelled: an attachment someone else made under the same name is
left alone and reported.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from gpuop.kube import client, customobjects, errors
from gpuop.kube.watching import object_key
from gpuop.policy import NetworkSpec, SecondaryNetwork

log = logging.getLogger(__name__)

RESOURCE = customobjects.NETWORK_ATTACHMENT_DEFINITIONS
KIND = "NetworkAttachmentDefinition"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuop-network-manager"
NETWORK_LABEL = "gpuop.io/network"
RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
CNI_VERSION = "0.4.0"

Obj = dict[str, Any]


def cni_config(network: SecondaryNetwork) -> Obj:
    """The CNI configuration pods on `network` are attached with."""
    pool = network.ipam
    ipam: Obj = {"type": "whereabouts", "range": pool.cidr, "exclude": pool.pod_exclusions()}
    if pool.gateway is not None:
        ipam["gateway"] = pool.gateway
    config: Obj = {
        "cniVersion": CNI_VERSION,
        "name": network.name,
        "type": network.type,
        "master": network.link_name,
        "mode": network.link_mode,
        "ipam": ipam,
    }
    if network.mtu is not None:
        config["mtu"] = network.mtu
    return config


def attachment(network: SecondaryNetwork) -> Obj:
    """The NetworkAttachmentDefinition of `network`."""
    annotations = {RESOURCE_ANNOTATION: network.resource_name} if network.resource_name else {}
    return {
        "apiVersion": RESOURCE.api_version,
        "kind": KIND,
        "metadata": {
            "name": network.name,
            "namespace": network.namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, NETWORK_LABEL: network.name},
            "annotations": annotations,
        },
        "spec": {"config": json.dumps(cni_config(network), sort_keys=True)},
    }


def changes(current: Obj, wanted: Obj) -> Obj | None:
    """The merge patch that turns gpuop's `current` attachment into `wanted`; None when it
    already is."""
    patch: Obj = {}
    metadata = current.get("metadata") or {}
    labels = metadata.get("labels") or {}
    wanted_labels = wanted["metadata"]["labels"]
    if any(labels.get(key) != value for key, value in wanted_labels.items()):
        patch.setdefault("metadata", {})["labels"] = wanted_labels
    annotations = metadata.get("annotations") or {}
    wanted_annotations = wanted["metadata"]["annotations"]
    if annotations.get(RESOURCE_ANNOTATION) != wanted_annotations.get(RESOURCE_ANNOTATION):
        patch.setdefault("metadata", {})["annotations"] = {
            RESOURCE_ANNOTATION: wanted_annotations.get(RESOURCE_ANNOTATION)
        }
    if (current.get("spec") or {}).get("config") != wanted["spec"]["config"]:
        patch["spec"] = wanted["spec"]
    return patch or None


@dataclass
class Report:
    """What one pass did to the cluster's attachments."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """Attachments that could not be written, with why."""

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


async def reconcile(kube: client.Kube, spec: NetworkSpec) -> Report:
    """Create, update and delete gpuop's attachments so there is exactly one per network
    of `spec`. Raises `KubeError` when the attachments cannot be listed (Multus' CRD not
    installed: `NotFound`); a single attachment that cannot be written is reported."""
    listed = await customobjects.list_objects(
        kube, RESOURCE, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    )
    current = {object_key(item): item for item in listed}
    report = Report()
    for network in spec.networks:
        wanted = attachment(network)
        key = (network.namespace, network.name)
        name = f"{network.namespace}/{network.name}"
        try:
            if key not in current:
                await customobjects.create(kube, RESOURCE, wanted)
                report.created.append(name)
                continue
            patch = changes(current[key], wanted)
            if patch is not None:
                await customobjects.patch(
                    kube, RESOURCE, network.name, patch, namespace=network.namespace
                )
                report.updated.append(name)
        except errors.AlreadyExists:
            report.refused.append(f"{name}: an attachment gpuop did not make has this name")
        except errors.NotFound:
            report.refused.append(f"{name}: namespace {network.namespace} does not exist")
        except (errors.Invalid, errors.Forbidden) as error:
            report.refused.append(f"{name}: {error}")
    wanted_keys = {(network.namespace, network.name) for network in spec.networks}
    for namespace, name in sorted(set(current) - wanted_keys):
        with contextlib.suppress(errors.NotFound):  # gone already: fine
            await customobjects.delete(kube, RESOURCE, name, namespace=namespace)
        report.deleted.append(f"{namespace}/{name}")
    return report
