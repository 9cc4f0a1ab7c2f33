"""network-manager: secondary networks on the nodes, and their NetworkAttachmentDefinitions.

The cluster role reads the GPUClusterPolicy's `network` section, publishes it in the
`gpuop_config` KV bucket for the node roles (which hold no Kubernetes credentials) and
writes one Multus NetworkAttachmentDefinition per network. The node role stacks a macvlan
or ipvlan link per network on the NIC the policy picks, with its MTU and an address claimed
in the `gpuop_ipam` KV bucket, never touches the NIC carrying the default route unless the
policy allows it, and publishes what came of each network and the node's RDMA devices.

    controller   cluster role: policy -> published section, attachments; `run`
    attachments  NetworkAttachmentDefinitions: rendering and reconciling
    node_agent   node role: watches the published section, converges, reports; `run`
    consumers    what the node role subscribes to
    applying     one convergence pass over the node's links
    outcomes     what a pass came to for each network, and the event reporting it
    planning     pure decisions: the management NIC, a network's NIC, link ownership
    addressing   address claims in `gpuop_ipam`
    netlink      the node's links through pyroute2's AsyncIPRoute, in a network namespace
    rdma         RDMA devices from sysfs, as `network.rdma-discovered`
    config       the `--config` file
"""

from gpuop.runtime.services import ServiceDefinition, by_role
from gpuop.runtime.settings import Role
from gpuop.services.network_manager import config

SERVICE = ServiceDefinition(
    name="network-manager",
    summary="secondary networks, IPAM and NetworkAttachmentDefinitions",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    main=by_role(config.load_config, f"{__name__}.node_agent", f"{__name__}.controller"),
)
