"""The CRD is generated from the models, committed as generated, and agrees with them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuop.policy import PolicyInvalid, validate_spec
from gpuop.policy import crd as crds
from gpuop_sim.apiserver import schemas
from tests.unit.policy.support import assert_schema_agrees

REPO = Path(__file__).resolve().parents[3]
HINT = (
    "the policy models changed: run `python -m gpuop.policy.crd "
    "deploy/crds/gpuclusterpolicies.gpuop.io.yaml` and commit the file"
)
MINIMAL = {"driver": {"gpu": {"version": "580.105.08"}}}


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, child in (schema.get("properties") or {}).items():
        found += walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += walk(schema[key], f"{path}[]")
    return found


def spec_schema() -> dict[str, Any]:
    spec: dict[str, Any] = crds.schema()["properties"]["spec"]
    return spec


def test_the_committed_crd_is_what_the_generator_writes() -> None:
    committed = REPO / crds.COMMITTED

    assert committed.is_file(), HINT
    assert committed.read_text(encoding="utf-8") == crds.render(), HINT


def test_the_rendered_yaml_is_the_built_object() -> None:
    assert yaml.safe_load(crds.render()) == crds.build()


def test_the_crd_serves_one_cluster_scoped_version_with_status() -> None:
    definition = crds.build()
    (version,) = definition["spec"]["versions"]

    assert definition["metadata"]["name"] == "gpuclusterpolicies.gpuop.io"
    assert definition["spec"]["scope"] == "Cluster"
    assert definition["spec"]["names"]["kind"] == "GPUClusterPolicy"
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["GPU"] == ".spec.driver.gpu.version"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_the_schema_is_structural() -> None:
    for path, node in walk(crds.schema()):
        assert "$ref" not in node and "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node and "anyOf" not in node, path


def test_every_spec_and_status_field_has_a_description() -> None:
    for path, node in walk(crds.schema()):
        if path.startswith((".spec", ".status")) and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"


def test_the_schema_carries_camel_case_names_bounds_and_required_fields() -> None:
    policy = spec_schema()["properties"]["upgradePolicy"]["properties"]

    assert spec_schema()["required"] == ["driver"]
    assert spec_schema()["properties"]["driver"]["properties"]["gpu"]["required"] == ["version"]
    assert policy["maxParallelUpgrades"]["minimum"] == 0
    assert policy["maxUnavailable"]["x-kubernetes-int-or-string"] is True
    assert policy["maxUnavailable"]["default"] == "25%"
    assert policy["deadlines"]["properties"]["driverInstall"]["minimum"] == 1
    assert "waitForCompletion" in policy and "wait_for_completion" not in policy
    assert policy["cordonedNodes"]["enum"] == ["upgradeFirst", "skip"]
    assert policy["cordonedNodes"]["default"] == "upgradeFirst"


def test_the_api_servers_defaults_are_the_models_defaults() -> None:
    stored = {"spec": copy.deepcopy(MINIMAL)}
    schemas.prune_and_default(stored, crds.schema())

    assert stored["spec"] == validate_spec(MINIMAL).to_wire()


AGREEMENT = [
    {"maxParallelUpgrades": -1},
    {"maxParallelUpgrades": "2"},
    {"maxParallelUpgrades": 0},
    {"maxUnavailable": 0},
    {"maxUnavailable": "0%"},
    {"maxUnavailable": "101%"},
    {"maxUnavailable": "5"},
    {"maxUnavailable": 2},
    {"maxUnavailable": "100%"},
    {"autoUpgrade": "true"},
    {"drain": {"timeoutSeconds": -1}},
    {"drain": {"timeoutSeconds": 0}},
    {"deadlines": {"reboot": 0}},
    {"deadlines": {"reboot": 604801}},
    {"canary": {"nodes": -1}},
    {"retry": {"maxAttempts": 0}},
    {"cordonedNodes": "skip"},
    {"cordonedNodes": "upgradeFirst"},
    {"cordonedNodes": "never"},
    {"cordonedNodes": 1},
]


@pytest.mark.parametrize("upgrade_policy", AGREEMENT, ids=repr)
def test_the_schema_and_the_models_agree_on_types_and_bounds(
    upgrade_policy: dict[str, Any],
) -> None:
    assert_schema_agrees({**MINIMAL, "upgradePolicy": upgrade_policy})


@pytest.mark.parametrize(
    "gpu",
    [{}, {"version": ""}, {"version": "5 80"}, {"version": 580}, {"version": "1", "source": "x"}],
    ids=repr,
)
def test_the_schema_refuses_bad_driver_fields_too(gpu: dict[str, Any]) -> None:
    raw = {"driver": {"gpu": gpu}}

    with pytest.raises(PolicyInvalid):
        validate_spec(raw)
    assert schemas.validate_object({"spec": raw}, crds.schema())


def test_main_writes_the_crd(tmp_path: Path) -> None:
    target = tmp_path / "crds" / "policy.yaml"

    assert crds.main([str(target)]) == 0
    assert target.read_text(encoding="utf-8") == crds.render()
    assert crds.main([]) == 2
