"""The `network` section: refused with the path of the wrong field, agreeing with the CRD,
and the pool arithmetic the node role claims addresses with."""

from __future__ import annotations

import copy
import ipaddress
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuop.policy import IpamPool, PolicyInvalid, PublishedNetwork, SecondaryNetwork, validate_spec
from gpuop.policy import crd as crds
from gpuop.policy.pools import MAX_POOL_SIZE
from gpuop_sim.apiserver import schemas
from tests.unit.policy.support import assert_schema_agrees, problems

GPU = {"gpu": {"version": "580.105.08"}}
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def roce(**fields: Any) -> dict[str, Any]:
    network: dict[str, Any] = {
        "name": "roce-a",
        "master": {"interface": "ens1f0np0"},
        "ipam": {"cidr": "192.168.100.0/24"},
    }
    network.update(fields)
    return network


def with_network(*networks: dict[str, Any], **section: Any) -> dict[str, Any]:
    return {"driver": GPU, "network": {"networks": list(networks), **section}}


PREFIX = "spec.network.networks[0]"
NOT_A_SUBNET = (
    f"{PREFIX}.ipam.cidr: must be a subnet in CIDR notation with the host bits zero, "
    'such as "192.168.100.0/24"'
)
INVALID = [
    pytest.param(roce(ipam={"cidr": "192.168.100.0"}), NOT_A_SUBNET, id="cidr-without-prefix"),
    pytest.param(roce(ipam={"cidr": "192.168.100.7/24"}), NOT_A_SUBNET, id="cidr-with-host-bits"),
    pytest.param(roce(ipam={"cidr": "192.168.300.0/24"}), NOT_A_SUBNET, id="cidr-not-an-address"),
    pytest.param(
        roce(ipam={"cidr": "192.168.100.0/24", "rangeStart": "10.0.0.1"}),
        f"{PREFIX}.ipam.rangeStart: 10.0.0.1 is not inside 192.168.100.0/24",
        id="range-outside",
    ),
    pytest.param(
        roce(ipam={"cidr": "192.168.100.0/24", "rangeStart": ".5"}),
        f'{PREFIX}.ipam.rangeStart: must be an IPv4 or IPv6 address, such as "192.168.100.1"',
        id="range-not-an-address",
    ),
    pytest.param(
        roce(
            ipam={
                "cidr": "192.168.100.0/24",
                "rangeStart": "192.168.100.50",
                "rangeEnd": "192.168.100.10",
            }
        ),
        f"{PREFIX}.ipam.rangeStart: must not come after rangeEnd (192.168.100.10)",
        id="range-backwards",
    ),
    pytest.param(
        roce(ipam={"cidr": "192.168.100.0/24", "gateway": "fd00::1"}),
        f"{PREFIX}.ipam.gateway: fd00::1 is not inside 192.168.100.0/24",
        id="gateway-other-family",
    ),
    pytest.param(
        roce(ipam={"cidr": "192.168.100.0/24", "exclude": ["192.168.0.0/16"]}),
        f"{PREFIX}.ipam.exclude[0]: 192.168.0.0/16 is not inside 192.168.100.0/24",
        id="exclusion-outside",
    ),
    pytest.param(
        roce(ipam={"cidr": "192.168.100.0/24", "exclude": ["192.168.100.0/33"]}),
        f"{PREFIX}.ipam.exclude[0]: must be an address or a subnet in CIDR notation, "
        'such as "192.168.100.64/28"',
        id="exclusion-malformed",
    ),
    pytest.param(
        roce(ipam={"cidr": "10.0.0.0/8"}),
        f"{PREFIX}.ipam.cidr: the range holds 16777214 addresses, at most {MAX_POOL_SIZE} are "
        "allowed: set rangeStart and rangeEnd",
        id="pool-too-big",
    ),
    pytest.param(
        roce(ipam={"cidr": "192.168.100.0/30", "exclude": ["192.168.100.1", "192.168.100.2"]}),
        f"{PREFIX}.ipam.cidr: leaves no address to give a node once the gateway and "
        "exclusions are taken out",
        id="pool-empty",
    ),
    pytest.param(
        roce(master={}),
        f"{PREFIX}.master: name the NIC with interface, or select it with vendors, deviceIDs "
        "or drivers",
        id="master-missing",
    ),
    pytest.param(
        roce(master={"interface": "eth0", "drivers": ["mlx5_core"]}),
        f"{PREFIX}.master.interface: a NIC named by interface takes no vendors, deviceIDs or "
        "drivers",
        id="master-both-ways",
    ),
    pytest.param(
        roce(master={"interface": "a-very-long-interface-name"}),
        f"{PREFIX}.master.interface: must be a network interface name: 1 to 15 letters, "
        "digits and _ . -, not starting with . or -",
        id="master-name-too-long",
    ),
    pytest.param(
        roce(master={"vendors": ["0x15b3"]}),
        f'{PREFIX}.master.vendors[0]: must be four hex digits without "0x", such as "15b3"',
        id="vendor-with-0x",
    ),
    pytest.param(
        roce(type="ipvlan", mode="bridge"),
        f"{PREFIX}.mode: ipvlan links take one of l2, l3, l3s",
        id="mode-of-another-type",
    ),
    pytest.param(
        roce(type="bridge"),
        f"{PREFIX}.type: Input should be 'macvlan' or 'ipvlan'",
        id="unknown-type",
    ),
    pytest.param(roce(mtu=9216 * 8), f"{PREFIX}.mtu: must be <= 65535", id="mtu-too-big"),
    pytest.param(
        roce(mtu=1000, ipam={"cidr": "fd00::/120"}),
        f"{PREFIX}.mtu: must be >= 1280 for an IPv6 subnet",
        id="mtu-too-small-for-ipv6",
    ),
    pytest.param(
        roce(name="RoCE_A"),
        f'{PREFIX}.name: must be lowercase letters, digits and "-", such as "roce-a"',
        id="name-not-a-label",
    ),
    pytest.param(
        roce(resourceName="roce_shared"),
        f'{PREFIX}.resourceName: must be an extended resource such as "rdma/roce_shared"',
        id="resource-without-prefix",
    ),
    pytest.param(roce(ipam=None), f"{PREFIX}.ipam: must be an object", id="ipam-null"),
    pytest.param(
        roce(ipam={"cidr": "192.168.100.0/24", "perNodeBlockSize": 0}),
        f"{PREFIX}.ipam.perNodeBlockSize: must be >= 1",
        id="block-size-zero",
    ),
    pytest.param(
        roce(
            ipam={"cidr": "192.168.100.0/28", "rangeStart": "192.168.100.8", "perNodeBlockSize": 8}
        ),
        f"{PREFIX}.ipam.perNodeBlockSize: the pool 192.168.100.0/28 has 7 addresses in "
        "192.168.100.8-192.168.100.14, fewer than one block of 8",
        id="block-larger-than-the-range",
    ),
    pytest.param(
        roce(masterInterface="eth0"), f"{PREFIX}.masterInterface: unknown field", id="typo"
    ),
]


@pytest.mark.parametrize(("network", "expected"), INVALID)
def test_a_wrong_network_field_is_refused_with_its_path(
    network: dict[str, Any], expected: str
) -> None:
    assert expected in problems(with_network(network))


def test_two_networks_of_one_name_are_refused() -> None:
    assert problems(with_network(roce(), roce())) == [
        "spec.network.networks: the name roce-a is used more than once"
    ]


def test_two_networks_on_one_link_name_are_refused() -> None:
    assert problems(with_network(roce(), roce(name="roce-b", interface="gpuop-roce-a"))) == [
        "spec.network.networks: the link name gpuop-roce-a is used more than once"
    ]


def test_networks_sharing_a_subnet_must_cut_it_into_the_same_blocks() -> None:
    blocked = {"cidr": "192.168.100.0/24", "perNodeBlockSize": 4}
    assert problems(
        with_network(roce(ipam=blocked), roce(name="roce-b", ipam={"cidr": "192.168.100.0/24"}))
    ) == [
        "spec.network.networks: networks roce-a and roce-b share the subnet 192.168.100.0/24: "
        "they must have the same perNodeBlockSize, rangeStart and rangeEnd when either has a "
        "block size"
    ]
    validate_spec(with_network(roce(ipam=blocked), roce(name="roce-b", ipam=blocked)))


def test_blocks_are_cut_from_the_range_start() -> None:
    pool = IpamPool.model_validate(
        {"cidr": "192.168.100.0/24", "rangeStart": "192.168.100.10", "perNodeBlockSize": 4}
    )
    assert pool.block_count == 61  # .10-.254: 245 addresses
    assert [str(a) for a in pool.block(1)] == ["192.168.100.14", "192.168.100.17"]
    with pytest.raises(ValueError, match="has no block 61"):
        pool.block(61)


def test_rdma_resources_need_a_selector_and_a_unique_name() -> None:
    empty = {"resourceName": "roce_shared", "selectors": {}}
    found = problems({"driver": GPU, "network": {"rdmaSharedDevices": [empty]}})
    twice = {"resourceName": "roce_shared", "selectors": {"vendors": ["15b3"]}}
    repeated = problems({"driver": GPU, "network": {"rdmaSharedDevices": [twice, twice]}})

    assert found == [
        "spec.network.rdmaSharedDevices[0].selectors: set at least one of vendors, "
        "deviceIDs, drivers, ifNames or linkTypes"
    ]
    assert repeated == [
        "spec.network.rdmaSharedDevices: the resource rdma/roce_shared is used more than once"
    ]


def test_the_defaults_are_safe_and_the_wire_names_are_upstreams() -> None:
    spec = validate_spec(
        with_network(
            roce(master={"vendors": ["15b3"], "deviceIDs": ["1021"]}),
            rdmaSharedDevices=[
                {"resourceName": "roce_shared", "selectors": {"linkTypes": ["ether"]}}
            ],
        )
    )
    section = spec.network

    assert validate_spec({"driver": GPU}).network.networks == []
    assert section.allow_management_nic_reconfigure is False
    assert section.allow_management_nic_reload is False
    network = section.networks[0]
    assert (network.namespace, network.type, network.link_mode) == ("default", "macvlan", "bridge")
    assert network.link_name == "gpuop-roce-a"
    assert section.rdma_shared_devices[0].full_name == "rdma/roce_shared"
    wire = spec.to_wire()["network"]
    assert wire["networks"][0]["master"]["deviceIDs"] == ["1021"]
    assert wire["rdmaSharedDevices"][0]["rdmaHcaMax"] == 64


def test_long_names_get_a_short_stable_link_name() -> None:
    network = SecondaryNetwork.model_validate(roce(name="training-fabric-east"))

    assert len(network.link_name) <= 15
    assert (
        network.link_name
        == SecondaryNetwork.model_validate(roce(name="training-fabric-east")).link_name
    )
    assert (
        network.link_name
        != SecondaryNetwork.model_validate(roce(name="training-fabric-west")).link_name
    )


def test_the_published_section_reads_back_as_it_was_written() -> None:
    section = validate_spec(with_network(roce(mtu=9000))).network
    published = PublishedNetwork(policy="default", generation=3, spec=section)

    assert PublishedNetwork.model_validate_json(published.encode()) == published


def test_candidates_skip_the_gateway_exclusions_and_the_broadcast_and_wrap_around() -> None:
    pool = IpamPool.model_validate(
        {"cidr": "10.0.0.0/29", "gateway": "10.0.0.1", "exclude": ["10.0.0.4/31"]}
    )

    assert [str(a) for a in pool.candidates()] == ["10.0.0.2", "10.0.0.3", "10.0.0.6"]
    assert [str(a) for a in pool.candidates(start=4)] == ["10.0.0.6", "10.0.0.2", "10.0.0.3"]
    assert not pool.assignable(ipaddress.ip_address("10.0.0.7"))
    assert pool.pod_exclusions() == ["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"]


def test_an_ipv6_pool_uses_every_address_of_its_range() -> None:
    pool = IpamPool.model_validate(
        {"cidr": "fd00:10::/64", "rangeStart": "fd00:10::fe", "rangeEnd": "fd00:10::101"}
    )

    assert pool.size == 4
    assert [str(a) for a in pool.candidates()] == [
        "fd00:10::fe",
        "fd00:10::ff",
        "fd00:10::100",
        "fd00:10::101",
    ]


AGREEMENT = [
    {"networks": [roce()]},
    {"networks": [roce(type="bridge")]},
    {"networks": [roce(mtu=67)]},
    {"networks": [roce(name="Upper")]},
    {"networks": [roce(master={"vendors": ["15b3x"]})]},
    {"networks": [roce(master={"interface": "x" * 16})]},
    {"networks": [{"name": "roce-a", "master": {"interface": "eth1"}}]},
    {"allowManagementNicReload": "yes"},
    {
        "rdmaSharedDevices": [
            {"resourceName": "r", "rdmaHcaMax": 0, "selectors": {"vendors": ["15b3"]}}
        ]
    },
    {"rdmaSharedDevices": [{"resourceName": "r", "selectors": {"linkTypes": ["ethernet"]}}]},
]


@pytest.mark.parametrize("section", AGREEMENT, ids=repr)
def test_the_schema_and_the_models_agree_on_network_types_and_bounds(
    section: dict[str, Any],
) -> None:
    assert_schema_agrees({"driver": GPU, "network": section})


def test_the_api_servers_defaults_for_a_network_are_the_models() -> None:
    raw = with_network(
        roce(), rdmaSharedDevices=[{"resourceName": "r", "selectors": {"vendors": ["15b3"]}}]
    )
    stored = {"spec": copy.deepcopy(raw)}

    schemas.prune_and_default(stored, crds.schema())

    assert stored["spec"]["network"] == validate_spec(raw).to_wire()["network"]


def test_a_bad_cidr_becomes_a_valid_false_condition_naming_the_field() -> None:
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(with_network(roce(ipam={"cidr": "192.168.100.0/40"})))

    condition = refused.value.condition(now=NOW, observed_generation=2)

    assert (condition.type, condition.status, condition.reason) == ("Valid", "False", "InvalidSpec")
    assert condition.message.startswith("spec.network.networks[0].ipam.cidr: must be a subnet")
