"""The node role's decisions on plain data: which NICs carry management traffic, which NIC
a network stacks on, which links gpuop owns and when a link must be made anew."""

from __future__ import annotations

from gpuop.events.network import NetworkFailureReason
from gpuop.host.netdevs import NetDevice
from gpuop.services.network_manager import planning
from gpuop.services.network_manager.netlink import Link, Snapshot
from tests.support.networks import network

CONNECTX = {"vendor_id": "15b3", "device_id": "1021", "driver": "mlx5_core"}


def nic(
    index: int,
    name: str,
    *,
    kind: str | None = None,
    lower: int | None = None,
    master: int | None = None,
    alias: str | None = None,
    mode: str | None = None,
) -> Link:
    return Link(index, name, kind, 1500, True, lower, master, alias, mode)


def facts(*names: str, **overrides: dict[str, str]) -> dict[str, NetDevice]:
    return {
        name: NetDevice(
            name, pci_address=f"0000:4{i}:00.0", **{**CONNECTX, **overrides.get(name, {})}
        )
        for i, name in enumerate(names)
    }


def plan(
    snapshot: Snapshot, known: dict[str, NetDevice]
) -> tuple[dict[str, NetDevice], frozenset[str]]:
    devices = planning.devices(snapshot, known)
    return devices, planning.management_links(snapshot, devices)


def test_the_default_route_nic_is_management() -> None:
    snapshot = Snapshot((nic(2, "eno1"), nic(3, "ens1f0")), frozenset({2}))

    _, protected = plan(snapshot, facts("eno1", "ens1f0"))

    assert protected == {"eno1"}


def test_the_members_of_a_default_route_bond_are_management_too() -> None:
    links = (
        nic(2, "eno1", master=4),
        nic(3, "eno2", master=4),
        nic(4, "bond0", kind="bond"),
        nic(5, "ens1f0"),
    )
    snapshot = Snapshot(links, frozenset({4}))

    _, protected = plan(snapshot, facts("eno1", "eno2", "ens1f0"))

    assert protected == {"bond0", "eno1", "eno2"}


def test_the_nic_under_a_default_route_vlan_is_management_but_a_veth_peer_is_not() -> None:
    links = (
        nic(2, "ens1f0"),
        nic(3, "mgmt", kind="vlan", lower=2),
        nic(4, "v0", kind="veth", lower=5),
        nic(5, "v1", kind="veth", lower=4),
    )
    snapshot = Snapshot(links, frozenset({3, 4}))

    _, protected = plan(snapshot, facts("ens1f0"))

    assert protected == {"mgmt", "ens1f0", "v0"}


def test_selectors_never_pick_the_management_nic_even_when_it_sorts_first() -> None:
    snapshot = Snapshot((nic(2, "eno1"), nic(3, "ens1f0")), frozenset({2}))
    devices, protected = plan(snapshot, facts("eno1", "ens1f0"))

    chosen = planning.choose_master(
        network(master={"vendors": ["15B3"]}), snapshot, devices, protected, allow_management=False
    )

    assert isinstance(chosen, Link) and chosen.name == "ens1f0"


def test_selectors_that_match_only_the_management_nic_are_refused_with_that_reason() -> None:
    snapshot = Snapshot((nic(2, "eno1"), nic(3, "ens1f0")), frozenset({2}))
    devices, protected = plan(snapshot, facts("eno1", "ens1f0", ens1f0={"driver": "ice"}))

    refused = planning.choose_master(
        network(master={"drivers": ["mlx5_core"]}),
        snapshot,
        devices,
        protected,
        allow_management=False,
    )

    assert isinstance(refused, planning.Refusal)
    assert refused.reason is NetworkFailureReason.MANAGEMENT_INTERFACE
    assert "eno1" in refused.message and "allowManagementNicReconfigure" in refused.message


def test_the_policy_can_allow_the_management_nic_explicitly() -> None:
    snapshot = Snapshot((nic(2, "eno1"), nic(3, "ens1f0")), frozenset({2}))
    devices, protected = plan(snapshot, facts("eno1", "ens1f0"))

    chosen = planning.choose_master(
        network(master={"interface": "eno1"}), snapshot, devices, protected, allow_management=True
    )

    assert isinstance(chosen, Link) and chosen.name == "eno1"


def test_a_named_management_nic_is_refused() -> None:
    snapshot = Snapshot((nic(2, "eno1"), nic(3, "ens1f0")), frozenset({2}))
    devices, protected = plan(snapshot, facts("eno1", "ens1f0"))

    refused = planning.choose_master(
        network(master={"interface": "eno1"}), snapshot, devices, protected, allow_management=False
    )

    assert isinstance(refused, planning.Refusal)
    assert refused.reason is NetworkFailureReason.MANAGEMENT_INTERFACE


def test_an_unknown_master_is_refused_with_its_name() -> None:
    snapshot = Snapshot((nic(2, "eno1"),), frozenset())

    refused = planning.choose_master(
        network(master={"interface": "ens9f9"}), snapshot, {}, frozenset(), allow_management=False
    )

    assert isinstance(refused, planning.Refusal)
    assert refused.reason is NetworkFailureReason.NO_MATCHING_NIC
    assert "ens9f9" in refused.message


def test_selectors_need_every_selector_to_match_and_skip_virtual_devices() -> None:
    snapshot = Snapshot(
        (nic(2, "ens1f0"), nic(3, "ens2f0"), nic(4, "veth0", kind="veth")), frozenset()
    )
    known = facts("ens1f0", "ens2f0", ens1f0={"device_id": "101d"})
    devices, protected = plan(snapshot, known)

    chosen = planning.choose_master(
        network(master={"vendors": ["15b3"], "deviceIDs": ["1021"]}),
        snapshot,
        devices,
        protected,
        allow_management=False,
    )
    nothing = planning.choose_master(
        network(master={"vendors": ["8086"]}), snapshot, devices, protected, allow_management=False
    )

    assert isinstance(chosen, Link) and chosen.name == "ens2f0"
    assert isinstance(nothing, planning.Refusal)
    assert nothing.reason is NetworkFailureReason.NO_MATCHING_NIC
    assert nothing.message == "network roce-a: no NIC with vendor 8086"


def test_gpuops_own_links_are_never_masters_and_are_found_by_their_alias() -> None:
    ours = nic(5, "gpuop-roce-a", kind="macvlan", lower=3, alias="gpuop:roce-a", mode="bridge")
    foreign = nic(6, "other", kind="macvlan", lower=3, alias="made by hand")
    snapshot = Snapshot((nic(3, "ens1f0"), ours, foreign), frozenset())

    refused = planning.choose_master(
        network(master={"interface": "gpuop-roce-a"}),
        snapshot,
        {},
        frozenset(),
        allow_management=False,
    )

    assert isinstance(refused, planning.Refusal)
    assert planning.owned_links(snapshot) == {"roce-a": ours}
    assert planning.owner_of(foreign) is None


def test_a_link_is_recreated_only_when_its_type_mode_or_nic_changes() -> None:
    master = nic(3, "ens1f0")
    link = nic(5, "gpuop-roce-a", kind="macvlan", lower=3, mode="bridge")

    assert not planning.must_recreate(link, network(mtu=9000), master)
    assert planning.must_recreate(link, network(mode="private"), master)
    assert planning.must_recreate(link, network(type="ipvlan"), master)
    assert planning.must_recreate(link, network(), nic(4, "ens2f0"))


def test_an_ofed_reload_cuts_off_a_default_route_on_a_connectx_port_only() -> None:
    snapshot = Snapshot((nic(2, "eno1"), nic(3, "ens1f0")), frozenset({2}))
    connectx, _ = plan(snapshot, facts("eno1", "ens1f0"))
    other, _ = plan(snapshot, facts("eno1", "ens1f0", eno1={"driver": "ice"}))

    assert planning.ofed_reload_cuts_off(snapshot, connectx) == ("eno1",)
    assert planning.ofed_reload_cuts_off(snapshot, other) == ()
