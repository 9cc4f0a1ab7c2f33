"""The address blocks' grants: a network-manager node agent reads every block and writes
none; network-manager's cluster role writes the blocks and nothing else of the IPAM bucket;
no other role touches them."""

from __future__ import annotations

import ipaddress

from gpuop.bus import grants, streams
from gpuop.bus.grants import Identity
from gpuop.services.network_manager import blocks
from gpuop.services.network_manager.addressing import claim_key

SUBNET = ipaddress.ip_network("10.10.0.0/24")
BLOCK = f"$KV.gpuop_ipam.{blocks.block_key(SUBNET, 3)}"
SINCE = f"$KV.gpuop_ipam.{blocks.since_key(SUBNET)}"
LISTING = f"$JS.API.CONSUMER.CREATE.KV_gpuop_ipam.w1.$KV.gpuop_ipam.{blocks.blocks_filter(SUBNET)}"


def allowed(granted: tuple[str, ...], subject: str) -> bool:
    return any(streams.subject_matches(pattern, subject) for pattern in granted)


def test_a_node_agent_reads_every_block_and_writes_none() -> None:
    for granted in (
        grants.for_identity(Identity("network-manager", "gpu-1")).publish,
        grants.for_service("network-manager").publish,
    ):
        assert not allowed(granted, BLOCK)
        assert not allowed(granted, SINCE)
        assert allowed(granted, LISTING)


def test_the_cluster_role_writes_blocks_and_no_claim() -> None:
    granted = grants.for_service("network-manager-cluster").publish
    held = ipaddress.ip_interface("10.10.0.5/24")

    assert allowed(granted, BLOCK) and allowed(granted, SINCE) and allowed(granted, LISTING)
    assert not allowed(granted, f"$KV.gpuop_ipam.{claim_key(held, 'gpu-1')}")
    assert not allowed(granted, "$KV.gpuop_ipam.node.gpu-1.roce-a")


def test_no_other_role_touches_the_blocks() -> None:
    for role in sorted(grants.ROLES - {"network-manager", "network-manager-cluster"}):
        granted = grants.for_service(role).publish
        assert not allowed(granted, BLOCK), role
        assert not allowed(granted, LISTING), role


def test_a_node_agent_writes_claims_of_its_own_in_either_family_and_no_other_key_shape() -> None:
    granted = grants.for_identity(Identity("network-manager", "gpu-1.example.com")).publish
    for address in ("10.10.0.5/24", "fd00:10::5/64"):
        held = ipaddress.ip_interface(address)
        assert allowed(granted, f"$KV.gpuop_ipam.{claim_key(held, 'gpu-1.example.com')}")
        assert not allowed(granted, f"$KV.gpuop_ipam.{claim_key(held, 'gpu-2')}")
    for made_up in ("x", "x.y.z", "a.b.c.d.e.f.g.h.i"):
        assert not allowed(granted, f"$KV.gpuop_ipam.claim.gpu-1_example_com.{made_up}")
