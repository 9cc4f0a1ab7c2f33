"""An invalid policy is refused with the camelCase path of each wrong field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import TypeAdapter

from gpuop.events.fields import Version
from gpuop.policy import FieldProblem, PolicyInvalid, valid_condition, validate_spec
from tests.unit.policy.support import problems

NOW = datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)
INT_OR_PERCENT = 'must be an integer >= 1 or a percentage like "25%"'


def spec_with(**upgrade_policy: Any) -> dict[str, Any]:
    return {"driver": {"gpu": {"version": "580.105.08"}}, "upgradePolicy": upgrade_policy}


def gpu(**component: Any) -> dict[str, Any]:
    return {"driver": {"gpu": component}}


INVALID = [
    pytest.param(
        spec_with(maxParallelUpgrades=-1),
        "spec.upgradePolicy.maxParallelUpgrades: must be >= 0",
        id="negative-max-parallel",
    ),
    pytest.param(
        spec_with(maxUnavailable="0%"),
        f"spec.upgradePolicy.maxUnavailable: {INT_OR_PERCENT}",
        id="max-unavailable-zero-percent",
    ),
    pytest.param(
        spec_with(maxUnavailable="150%"),
        f"spec.upgradePolicy.maxUnavailable: {INT_OR_PERCENT}",
        id="max-unavailable-over-100-percent",
    ),
    pytest.param(
        spec_with(maxUnavailable="abc"),
        f"spec.upgradePolicy.maxUnavailable: {INT_OR_PERCENT}",
        id="max-unavailable-word",
    ),
    pytest.param(
        spec_with(maxUnavailable="3"),
        f"spec.upgradePolicy.maxUnavailable: {INT_OR_PERCENT}",
        id="max-unavailable-number-as-string",
    ),
    pytest.param(
        spec_with(maxUnavailable=0),
        f"spec.upgradePolicy.maxUnavailable: {INT_OR_PERCENT}",
        id="max-unavailable-zero",
    ),
    pytest.param(
        spec_with(maxUnavailable=True),
        f"spec.upgradePolicy.maxUnavailable: {INT_OR_PERCENT}",
        id="max-unavailable-boolean",
    ),
    pytest.param(
        spec_with(maxUnavailabel=1),
        "spec.upgradePolicy.maxUnavailabel: unknown field",
        id="unknown-field",
    ),
    pytest.param(
        {"driver": {"gpu": {"version": "1"}}, "upgrade_policy": {"max_unavail": 1}},
        "spec.upgradePolicy.max_unavail: unknown field",
        id="unknown-field-named-as-written",
    ),
    pytest.param(
        gpu(source="/srv/drivers"),
        "spec.driver.gpu.version: required field is missing",
        id="missing-gpu-version",
    ),
    pytest.param({}, "spec.driver: required field is missing", id="missing-driver"),
    pytest.param(
        gpu(version="580 105"),
        'spec.driver.gpu.version: must be a version such as "580.105.08": letters, digits '
        'and ". + _ ~ -", starting with a letter or digit',
        id="bad-version",
    ),
    pytest.param(gpu(version=""), "spec.driver.gpu.version: must not be empty", id="empty-version"),
    pytest.param(
        gpu(version="1" * 65),
        "spec.driver.gpu.version: must be at most 64 characters long",
        id="long-version",
    ),
    pytest.param(
        gpu(version=580.105),
        "spec.driver.gpu.version: must be a string",
        id="version-as-number",
    ),
    pytest.param(
        gpu(version="580", source="drivers/580"),
        "spec.driver.gpu.source: must be an absolute directory path, a file:// URL or an "
        "http(s) URL",
        id="relative-source",
    ),
    pytest.param(
        gpu(version="580", source="ftp://mirror.example/drivers"),
        "spec.driver.gpu.source: must be an absolute directory path, a file:// URL or an "
        "http(s) URL",
        id="ftp-source",
    ),
    pytest.param(
        gpu(version="580", source="https:///drivers"),
        "spec.driver.gpu.source: must be an absolute directory path, a file:// URL or an "
        "http(s) URL",
        id="url-without-host",
    ),
    pytest.param(
        {"driver": {"gpu": {"version": "580"}, "ofed": {"version": "24.10", "src": "/x"}}},
        "spec.driver.ofed.src: unknown field",
        id="unknown-ofed-field",
    ),
    pytest.param(
        spec_with(canary={"nodes": -1}),
        "spec.upgradePolicy.canary.nodes: must be >= 0",
        id="negative-canary",
    ),
    pytest.param(
        spec_with(deadlines={"driverLoad": 0}),
        "spec.upgradePolicy.deadlines.driverLoad: must be >= 1",
        id="zero-deadline",
    ),
    pytest.param(
        spec_with(deadlines={"reboot": 8 * 86400}),
        "spec.upgradePolicy.deadlines.reboot: must be <= 604800",
        id="deadline-over-a-week",
    ),
    pytest.param(
        spec_with(podDeletion={"timeoutSeconds": -5}),
        "spec.upgradePolicy.podDeletion.timeoutSeconds: must be >= 0",
        id="negative-timeout",
    ),
    pytest.param(
        spec_with(drain={"enable": "yes"}),
        "spec.upgradePolicy.drain.enable: must be true or false",
        id="boolean-as-string",
    ),
    pytest.param(
        spec_with(maxParallelUpgrades="4"),
        "spec.upgradePolicy.maxParallelUpgrades: must be an integer",
        id="integer-as-string",
    ),
    pytest.param(
        spec_with(drain={"podSelector": "app in training"}),
        "spec.upgradePolicy.drain.podSelector: must be a label selector such as "
        '"app=training,tier!=batch"',
        id="bad-selector",
    ),
    pytest.param(
        spec_with(retry={"maxAttempts": 0}),
        "spec.upgradePolicy.retry.maxAttempts: must be >= 1",
        id="no-attempts",
    ),
    pytest.param(
        spec_with(retry={"backoffSeconds": 120, "maxBackoffSeconds": 60}),
        "spec.upgradePolicy.retry.maxBackoffSeconds: must be at least backoffSeconds (120)",
        id="backoff-cap-below-base",
    ),
    pytest.param(
        spec_with(wait_for_completion=[]),
        "spec.upgradePolicy.waitForCompletion: must be an object",
        id="section-as-list",
    ),
    pytest.param(
        spec_with(cordonedNodes="sometimes"),
        "spec.upgradePolicy.cordonedNodes: Input should be 'upgradeFirst' or 'skip'",
        id="cordoned-nodes-unknown",
    ),
    pytest.param(
        spec_with(cordonedNodes="Skip"),
        "spec.upgradePolicy.cordonedNodes: Input should be 'upgradeFirst' or 'skip'",
        id="cordoned-nodes-wrong-case",
    ),
    pytest.param(
        spec_with(cordonedNodes=True),
        "spec.upgradePolicy.cordonedNodes: Input should be 'upgradeFirst' or 'skip'",
        id="cordoned-nodes-boolean",
    ),
    pytest.param(None, "spec: must be an object", id="no-spec"),
]


@pytest.mark.parametrize(("raw", "expected"), INVALID)
def test_an_invalid_field_is_refused_with_its_path(raw: Any, expected: str) -> None:
    assert problems(raw) == [expected]


def test_every_wrong_field_is_reported_at_once() -> None:
    found = problems(
        {
            "driver": {"gpu": {"version": "5 80"}},
            "upgradePolicy": {"maxParallelUpgrades": -1, "canary": {"nodes": -2}},
        }
    )

    assert [problem.split(":")[0] for problem in found] == [
        "spec.driver.gpu.version",
        "spec.upgradePolicy.maxParallelUpgrades",
        "spec.upgradePolicy.canary.nodes",
    ]


@pytest.mark.parametrize("value", ["upgradeFirst", "skip"])
def test_cordoned_nodes_accepts_its_two_values(value: str) -> None:
    assert validate_spec(spec_with(cordonedNodes=value)).upgrade_policy.cordoned_nodes == value


@pytest.mark.parametrize("value", [1, 7, "1%", "25%", "99%", "100%"], ids=lambda value: repr(value))
def test_max_unavailable_accepts_counts_and_percentages(value: int | str) -> None:
    assert validate_spec(spec_with(maxUnavailable=value)).upgrade_policy.max_unavailable == value


@pytest.mark.parametrize(
    "source",
    [
        "/srv/drivers",
        "/host/srv/drivers/",
        "file:///srv/drivers",
        "http://mirror.local:8080/drivers",
        "https://mirror.example/nvidia/index.json",
    ],
)
def test_driver_sources_are_directories_and_urls(source: str) -> None:
    assert validate_spec(gpu(version="580", source=source)).driver.gpu.source == source


@pytest.mark.parametrize("version", ["580.105.08", "24.10-1.1.4.0", "13.0", "550.54.15+dkms~1"])
def test_versions_the_policy_accepts_are_versions_the_commands_accept(version: str) -> None:
    assert validate_spec(gpu(version=version)).driver.gpu.version == version
    assert TypeAdapter(Version).validate_python(version) == version


def test_zero_upstream_timeouts_are_accepted() -> None:
    policy = validate_spec(
        spec_with(
            waitForCompletion={"podSelector": "job-kind=training", "timeoutSeconds": 0},
            podDeletion={"timeoutSeconds": 0},
            drain={"enable": True, "timeoutSeconds": 0},
        )
    ).upgrade_policy

    assert policy.drain.timeout_seconds == 0


def test_an_invalid_spec_gives_a_valid_false_condition_naming_the_field() -> None:
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(spec_with(maxUnavailable="0%"))

    condition = refused.value.condition(now=NOW, observed_generation=3)

    assert refused.value.problems == (
        FieldProblem("spec.upgradePolicy.maxUnavailable", INT_OR_PERCENT),
    )
    assert condition.model_dump(mode="json", by_alias=True) == {
        "type": "Valid",
        "status": "False",
        "reason": "InvalidSpec",
        "message": f"spec.upgradePolicy.maxUnavailable: {INT_OR_PERCENT}",
        "lastTransitionTime": "2026-03-01T12:00:00Z",
        "observedGeneration": 3,
    }


def test_a_valid_spec_gives_a_valid_true_condition() -> None:
    condition = valid_condition(now=NOW)

    assert (condition.type, condition.status, condition.reason) == ("Valid", "True", "ValidSpec")
