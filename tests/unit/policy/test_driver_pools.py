"""Driver pools in the policy: a node selector with drivers of its own, never overlapping."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop import selectors
from gpuop.policy import PolicyInvalid, validate_spec

DEFAULT = {"gpu": {"version": "580.105.08"}, "ofed": {"version": "25.04-0.6.1.0"}}


def spec_with(*pools: dict[str, Any]) -> dict[str, Any]:
    return {"driver": {**DEFAULT, "pools": list(pools)}}


def refusal(*pools: dict[str, Any]) -> str:
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(spec_with(*pools))
    return refused.value.message


def test_a_pool_runs_its_own_drivers_and_inherits_what_it_leaves_unset() -> None:
    spec = validate_spec(
        spec_with(
            {"name": "h100", "nodeSelector": "gpu=h100", "gpu": {"version": "570.172.08"}},
            {"name": "h200", "nodeSelector": "gpu=h200", "upgradePolicy": {"canary": {"nodes": 1}}},
        )
    )
    driver = spec.driver
    h100 = driver.pool_for({"gpu": "h100", "rack": "r1"})
    assert h100 is not None and h100.name == "h100"
    assert driver.pool_for({"gpu": "a100"}) is None
    gpu, ofed = driver.components_of("h100")
    assert (gpu.version, ofed and ofed.version) == ("570.172.08", "25.04-0.6.1.0")
    assert driver.components_of("h200")[0].version == "580.105.08"
    assert driver.components_of(None) == (driver.gpu, driver.ofed)
    with pytest.raises(KeyError, match="no driver pool 'a100'"):
        driver.pool("a100")
    assert validate_spec(spec.to_wire()) == spec


def test_overlapping_selectors_are_refused_naming_both_pools_and_a_node_in_both() -> None:
    message = refusal(
        {"name": "train", "nodeSelector": "pool=train"},
        {"name": "big", "nodeSelector": "gpu.count>4"},
    )
    assert message.startswith("spec.driver.pools[1]: pools 'train' and 'big' overlap")
    assert "a node labelled gpu.count=5,pool=train matches both" in message


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("pool=a", "pool=b"),
        ("pool=a", "!pool"),
        ("pool in (a,b)", "pool notin (a,b)"),
        ("gen>3", "gen<4"),
        ("gpu=h200,zone=a", "gpu=h200,zone=b"),
    ],
)
def test_exclusive_selectors_are_accepted(first: str, second: str) -> None:
    spec = validate_spec(
        spec_with({"name": "one", "nodeSelector": first}, {"name": "two", "nodeSelector": second})
    )
    assert [p.name for p in spec.driver.pools] == ["one", "two"]


@pytest.mark.parametrize(
    ("first", "second", "both"),
    [
        ("pool=a", "pool=a", {"pool": "a"}),
        ("pool!=a", "pool!=b", {}),
        ("gen>3", "gen<5", {"gen": "4"}),
        ("pool in (a,b)", "pool notin (a)", {"pool": "b"}),
        ("zone", "pool=a", {"pool": "a", "zone": "x"}),
    ],
)
def test_common_labels_finds_a_node_both_selectors_match(
    first: str, second: str, both: dict[str, str]
) -> None:
    found = selectors.common_labels(selectors.parse(first), selectors.parse(second))
    assert found == both
    assert selectors.matches(selectors.parse(first), found)
    assert selectors.matches(selectors.parse(second), found)


def test_names_are_unique_dns_labels_and_default_is_reserved() -> None:
    twice = refusal(
        {"name": "a", "nodeSelector": "pool=a"}, {"name": "a", "nodeSelector": "pool=b"}
    )
    assert (
        twice == "spec.driver.pools[1]: name 'a' is used by pools[0] too: pool names must be unique"
    )
    reserved = refusal({"name": "default", "nodeSelector": "pool=a"})
    assert "reserved for the nodes no pool selects" in reserved
    assert "spec.driver.pools[0].name" in refusal({"name": "Big_Pool", "nodeSelector": "p=a"})


def test_a_pool_needs_a_well_formed_selector() -> None:
    assert "spec.driver.pools[0].nodeSelector: must not be empty" in refusal(
        {"name": "a", "nodeSelector": ""}
    )
    assert "must be a label selector" in refusal({"name": "a", "nodeSelector": "pool in a"})
    assert "spec.driver.pools[0].upgradePolicy.maxParallelUpgrades: must be >= 0" in refusal(
        {"name": "a", "nodeSelector": "p=a", "upgradePolicy": {"maxParallelUpgrades": -1}}
    )
