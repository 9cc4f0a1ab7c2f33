"""Defaults follow the GPU Operator's, and the spec reads and writes camelCase."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuop.policy import (
    ComponentSpec,
    Deadlines,
    DriverSpec,
    GPUClusterPolicySpec,
    UpgradePolicy,
    validate_spec,
)

MINIMAL = {"driver": {"gpu": {"version": "580.105.08"}}}


def test_upstream_fields_default_to_the_gpu_operators_values() -> None:
    policy = validate_spec(MINIMAL).upgrade_policy

    assert policy.auto_upgrade is True
    assert policy.max_parallel_upgrades == 1
    assert policy.max_unavailable == "25%"
    assert policy.wait_for_completion.pod_selector == ""
    assert policy.wait_for_completion.timeout_seconds == 0
    assert policy.pod_deletion.force is False
    assert policy.pod_deletion.timeout_seconds == 300
    assert policy.pod_deletion.delete_empty_dir is False
    assert policy.drain.enable is False
    assert policy.drain.force is False
    assert policy.drain.pod_selector == ""
    assert policy.drain.timeout_seconds == 300
    assert policy.drain.delete_empty_dir is False


def test_gpuop_fields_default_to_safe_values() -> None:
    policy = validate_spec(MINIMAL).upgrade_policy

    assert policy.reboot_on_unload_failure is False
    assert policy.rollback_on_failure is True
    assert policy.failed_nodes_hold_slot is False
    assert (policy.retry.max_attempts, policy.retry.backoff_seconds) == (3, 60)
    assert policy.retry.max_backoff_seconds == 900
    assert policy.canary.nodes == 0
    assert policy.cordoned_nodes == "upgradeFirst"  # upstream's way with cordoned nodes
    assert policy.deadlines == Deadlines(
        cordon=120,
        wait_for_jobs=3600,
        pod_deletion=600,
        drain=900,
        operands_pause=300,
        driver_unload=300,
        driver_install=900,
        driver_load=300,
        validation=600,
        reboot=900,
        rollback=900,
        uncordon=120,
    )


def test_a_minimal_spec_has_no_ofed_and_no_source() -> None:
    spec = validate_spec(MINIMAL)

    assert spec.driver == DriverSpec(gpu=ComponentSpec(version="580.105.08"))
    assert spec.driver.ofed is None
    assert spec.driver.gpu.source is None


def test_the_wire_form_is_camel_case_and_reads_back_equal() -> None:
    spec = validate_spec(
        {
            "driver": {
                "gpu": {"version": "580.105.08", "source": "https://mirror.example/drivers"},
                "ofed": {"version": "24.10-1.1.4.0", "source": "/srv/ofed"},
            },
            "upgradePolicy": {
                "maxParallelUpgrades": 4,
                "maxUnavailable": 2,
                "waitForCompletion": {"podSelector": "app=training", "timeoutSeconds": 60},
                "drain": {"enable": True, "deleteEmptyDir": True},
                "rebootOnUnloadFailure": True,
                "failedNodesHoldSlot": True,
                "retry": {"maxAttempts": 5, "backoffSeconds": 10, "maxBackoffSeconds": 40},
                "deadlines": {"driverInstall": 1800},
                "canary": {"nodes": 2},
            },
        }
    )
    wire = spec.to_wire()

    assert validate_spec(wire) == spec
    policy = wire["upgradePolicy"]
    assert policy["maxUnavailable"] == 2
    assert policy["waitForCompletion"] == {"podSelector": "app=training", "timeoutSeconds": 60}
    assert policy["deadlines"]["driverInstall"] == 1800
    assert policy["retry"] == {"maxAttempts": 5, "backoffSeconds": 10, "maxBackoffSeconds": 40}
    assert "max_parallel_upgrades" not in policy


def test_the_wire_form_leaves_unset_optionals_out() -> None:
    # kernelModuleType is no optional: the API server defaults it as the model does
    wire = validate_spec(MINIMAL).to_wire()["driver"]
    assert wire == {"gpu": {"version": "580.105.08", "kernelModuleType": "auto"}}


def test_attribute_names_are_accepted_as_well() -> None:
    spec = validate_spec(
        {"driver": {"gpu": {"version": "1.0"}}, "upgrade_policy": {"max_parallel_upgrades": 3}}
    )

    assert spec.upgrade_policy.max_parallel_upgrades == 3


def test_policies_are_frozen_and_hashable() -> None:
    policy = UpgradePolicy()

    with pytest.raises(ValidationError):
        policy.max_parallel_upgrades = 2  # type: ignore[misc]
    assert hash(policy) == hash(UpgradePolicy())
    assert GPUClusterPolicySpec(driver=DriverSpec(gpu=ComponentSpec(version="1"))) == (
        validate_spec({"driver": {"gpu": {"version": "1"}}})
    )
