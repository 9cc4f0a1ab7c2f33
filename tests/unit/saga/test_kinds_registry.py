"""The kind contract (`gpuop.saga.kinds`) and the registry every runtime path iterates."""

from __future__ import annotations

from gpuop.events import subjects
from gpuop.events.upgrade import TERMINAL_STATES, UpgradeState
from gpuop.saga.registry import KINDS, kind_named


def test_the_registry_lists_the_upgrade_remediation_mig_and_device_api_in_deciding_order() -> None:
    assert [kind.name for kind in KINDS] == [
        "driver-upgrade",
        "gpu-remediation",
        "mig-reconfiguration",
        "device-api",
    ]
    assert kind_named("gpu-remediation") is KINDS[1]
    assert len({kind.started_by for kind in KINDS}) == len(KINDS)
    assert len({kind.state_change for kind in KINDS}) == len(KINDS)


def test_record_keys_are_the_ones_stored_before_the_kinds_shared_one_contract() -> None:
    node = "gpu.node-1"
    token = subjects.encode_node(node)
    keys = {kind.name: kind.key(node) for kind in KINDS}
    assert keys == {
        "driver-upgrade": token,
        "gpu-remediation": f"remediation.{token}",
        "mig-reconfiguration": f"mig.{token}",
        "device-api": f"device-api.{token}",
    }
    for kind in KINDS:
        owners = [other.name for other in KINDS if other.owns(kind.key(node))]
        assert owners == [kind.name]
        assert kind.node_of(kind.key(node)) == node
    assert not any(kind.owns("_presence") for kind in KINDS)


def test_a_remediation_folds_into_an_upgrade_only_while_its_reload_is_ahead() -> None:
    folds = {state for state in UpgradeState if state.remediation_folds_in}
    # not before its admission, nor once the reload is behind it, nor in a rollback that may
    # reload no GPU driver: there the remediation waits for its own admission
    apart = {
        UpgradeState.UPGRADE_REQUIRED,
        UpgradeState.ROLLBACK_REQUIRED,
        UpgradeState.VALIDATION_REQUIRED,
        UpgradeState.UNCORDON_REQUIRED,
        *TERMINAL_STATES,
    }
    assert folds.isdisjoint(apart) and folds | apart == set(UpgradeState)
