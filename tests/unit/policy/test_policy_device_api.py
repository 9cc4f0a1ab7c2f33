"""`deviceAPI` in the policy: which kubelet API serves a node's GPUs, top level and per pool."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.events.device_api_commands import DeviceApi
from gpuop.policy import validate_spec
from tests.unit.policy.support import assert_schema_agrees, problems

DRIVER = {"gpu": {"version": "580.105.08"}}


def spec(device_api: Any = None, *pools: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {"driver": {**DRIVER, "pools": list(pools)}}
    if device_api is not None:
        raw["deviceAPI"] = device_api
    return raw


def test_unset_serves_every_node_through_the_device_plugin_and_stays_off_the_wire() -> None:
    policy = validate_spec(spec())
    assert policy.device_api is None
    assert policy.device_api_for({"any": "label"}) is DeviceApi.DEVICE_PLUGIN
    assert "deviceAPI" not in policy.to_wire()


def test_the_top_level_value_serves_the_nodes_of_no_pool_and_round_trips() -> None:
    policy = validate_spec(spec("dra"))
    assert policy.device_api_for({}) is DeviceApi.DRA
    assert policy.to_wire()["deviceAPI"] == "dra"
    assert validate_spec(policy.to_wire()) == policy


def test_a_pool_chooses_for_its_nodes_and_inherits_when_it_leaves_it_unset() -> None:
    policy = validate_spec(
        spec(
            "devicePlugin",
            {"name": "h200", "nodeSelector": "gpu=h200", "deviceAPI": "dra"},
            {"name": "h100", "nodeSelector": "gpu=h100"},
        )
    )
    assert policy.device_api_for({"gpu": "h200"}) is DeviceApi.DRA
    assert policy.device_api_for({"gpu": "h100"}) is DeviceApi.DEVICE_PLUGIN
    assert policy.device_api_for({}) is DeviceApi.DEVICE_PLUGIN


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("DRA", "not 'DRA' (did you mean dra?)"),
        ("device-plugin", "not 'device-plugin' (did you mean devicePlugin?)"),
        ("vfio", "not 'vfio'"),
        (1, "must be devicePlugin or dra (a string)"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_the_two_values(value: Any, words: str) -> None:
    (problem,) = problems(spec(value))
    assert problem.startswith("spec.deviceAPI: must be devicePlugin")
    assert words in problem


def test_a_bad_pool_value_names_the_pool() -> None:
    (problem,) = problems(spec(None, {"name": "a", "nodeSelector": "x=y", "deviceAPI": "Dra"}))
    assert problem.startswith("spec.driver.pools[0].deviceAPI: must be devicePlugin")
    assert "did you mean dra?" in problem


@pytest.mark.parametrize("value", ["dra", "devicePlugin", "DRA", "", 3])
def test_the_crd_schema_accepts_exactly_what_the_model_does(value: Any) -> None:
    assert_schema_agrees(spec(value))
    assert_schema_agrees(spec(None, {"name": "a", "nodeSelector": "x=y", "deviceAPI": value}))
