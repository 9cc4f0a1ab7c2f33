"""The example GPUClusterPolicy (deploy/examples, shown in the README) against the CRD the
chart installs: its openAPIV3Schema accepts the example and rejects a policy with a bad
field, as an API server with strict field validation (kubectl's default) would; and the
orchestrator's own validation agrees."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import yaml

from gpuop.policy import PolicyInvalid, validate_spec
from tests.support.charts import REPO, crds

EXAMPLE = REPO / "deploy" / "examples" / "gpuclusterpolicy.yaml"
Policy = dict[str, Any]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The structural schema as JSON Schema, unknown fields refused where the API server's
    strict field validation refuses them (objects with properties, no
    x-kubernetes-preserve-unknown-fields)."""
    schema = copy.deepcopy(schema)

    def close(node: dict[str, Any]) -> None:
        closable = "properties" in node and "additionalProperties" not in node
        if closable and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for child in (node.get("properties") or {}).values():
            close(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                close(node[key])

    close(schema)
    return schema


def crd_schema() -> dict[str, Any]:
    (crd,) = crds()
    (version,) = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"]) == ("gpuop.io", "v1alpha1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def schema_errors(policy: Policy) -> list[str]:
    validator = jsonschema.Draft7Validator(strict(crd_schema()))
    return [
        "/".join(str(p) for p in error.absolute_path) + ": " + error.message
        for error in validator.iter_errors(policy)
    ]


def example() -> Policy:
    loaded: Policy = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    return loaded


def test_the_example_is_a_gpuclusterpolicy_the_crd_and_the_orchestrator_accept() -> None:
    policy = example()

    assert (policy["apiVersion"], policy["kind"]) == ("gpuop.io/v1alpha1", "GPUClusterPolicy")
    assert schema_errors(policy) == []
    spec = validate_spec(policy["spec"])
    assert spec.driver.gpu.version == policy["spec"]["driver"]["gpu"]["version"]


def test_the_example_says_what_its_settings_do() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    comments = [line for line in text.splitlines() if line.strip().startswith("#")]

    assert len(comments) >= 20


def _set(path: str, value: Any) -> Callable[[Policy], None]:
    def change(policy: Policy) -> None:
        *parents, last = path.split(".")
        node: Any = policy
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value

    return change


def _remove(path: str) -> Callable[[Policy], None]:
    def change(policy: Policy) -> None:
        *parents, last = path.split(".")
        node: Any = policy
        for key in parents:
            node = node[key]
        del node[last]

    return change


@pytest.mark.parametrize(
    ("change", "where"),
    [
        pytest.param(
            _set("spec.upgradePolicy.maxParallelUpgrade", 4),
            "spec/upgradePolicy",
            id="misspelt-field",
        ),
        pytest.param(
            _set("spec.upgradePolicy.maxParallelUpgrades", "four"),
            "spec/upgradePolicy/maxParallelUpgrades",
            id="wrong-type",
        ),
        pytest.param(
            _set("spec.upgradePolicy.retry.maxAttempts", 0),
            "spec/upgradePolicy/retry/maxAttempts",
            id="below-minimum",
        ),
        pytest.param(
            _set("spec.upgradePolicy.maxUnavailable", "150%"),
            "spec/upgradePolicy/maxUnavailable",
            id="bad-percentage",
        ),
        pytest.param(
            _set("spec.network.networks.0.type", "vxlan"),
            "spec/network/networks/0/type",
            id="not-in-enum",
        ),
        pytest.param(_remove("spec.driver.gpu.version"), "spec/driver/gpu", id="required-missing"),
        pytest.param(
            _set("spec.driver.gpu.version", "580 beta"),
            "spec/driver/gpu/version",
            id="bad-version",
        ),
    ],
)
def test_a_policy_with_a_bad_field_is_rejected(
    change: Callable[[Policy], None], where: str
) -> None:
    policy = example()
    change(policy)

    errors = schema_errors(policy)
    assert errors, "the CRD's schema accepted it"
    assert any(error.startswith(where + ":") for error in errors), errors
    with pytest.raises(PolicyInvalid):
        validate_spec(policy["spec"])


def test_the_crd_file_read_by_the_test_is_the_committed_one() -> None:
    committed = yaml.safe_load((REPO / "deploy/crds/gpuclusterpolicies.gpuop.io.yaml").read_text())

    assert crds() == [committed]
