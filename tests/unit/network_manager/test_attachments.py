"""What a network's NetworkAttachmentDefinition says, and the patch that brings an
existing one in line."""

from __future__ import annotations

import json

from gpuop.services.network_manager import attachments
from tests.support.networks import network


def test_pods_stack_on_gpuops_link_and_get_the_subnet_without_the_node_range() -> None:
    roce = network(
        mtu=9000,
        ipam={
            "cidr": "192.168.100.0/24",
            "rangeStart": "192.168.100.16",
            "rangeEnd": "192.168.100.31",
            "gateway": "192.168.100.1",
            "exclude": ["192.168.100.200/29"],
        },
    )

    config = attachments.cni_config(roce)

    assert config == {
        "cniVersion": "0.4.0",
        "name": "roce-a",
        "type": "macvlan",
        "master": "gpuop-roce-a",
        "mode": "bridge",
        "mtu": 9000,
        "ipam": {
            "type": "whereabouts",
            "range": "192.168.100.0/24",
            "exclude": ["192.168.100.1/32", "192.168.100.16/28", "192.168.100.200/29"],
            "gateway": "192.168.100.1",
        },
    }


def test_the_attachment_is_labelled_namespaced_and_names_the_device_resource() -> None:
    roce = network(namespace="training", resourceName="rdma/roce_shared", type="ipvlan", mode="l3")

    body = attachments.attachment(roce)

    assert body["apiVersion"] == "k8s.cni.cncf.io/v1"
    assert body["kind"] == "NetworkAttachmentDefinition"
    assert (body["metadata"]["namespace"], body["metadata"]["name"]) == ("training", "roce-a")
    assert body["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gpuop-network-manager",
        "gpuop.io/network": "roce-a",
    }
    assert body["metadata"]["annotations"] == {
        "k8s.v1.cni.cncf.io/resourceName": "rdma/roce_shared"
    }
    config = json.loads(body["spec"]["config"])
    assert (config["type"], config["mode"]) == ("ipvlan", "l3")
    assert "mtu" not in config


def test_an_attachment_already_as_wanted_needs_no_patch() -> None:
    wanted = attachments.attachment(network())
    stored = {**wanted, "metadata": {**wanted["metadata"], "resourceVersion": "7", "uid": "u"}}

    assert attachments.changes(stored, wanted) is None


def test_a_changed_network_patches_the_config_and_drops_a_removed_resource_annotation() -> None:
    before = attachments.attachment(network(resourceName="rdma/roce_shared"))
    after = attachments.attachment(network(mtu=4200))

    patch = attachments.changes(before, after)

    assert patch == {
        "metadata": {"annotations": {"k8s.v1.cni.cncf.io/resourceName": None}},
        "spec": {"config": after["spec"]["config"]},
    }
