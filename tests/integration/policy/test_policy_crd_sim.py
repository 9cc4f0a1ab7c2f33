"""The generated GPUClusterPolicy CRD, installed in the simulated API server: the server
stores valid policies with the models' defaults and refuses wrong types with 422."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio import client, config

from gpuop.policy import (
    ConditionType,
    PolicyStatus,
    condition,
    crd,
    specs,
    valid_condition,
    validate_spec,
)
from gpuop_sim import ApiServer

REPO = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def policy(spec: dict[str, Any], name: str = "cluster-policy") -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture
async def custom(tmp_path: Path) -> AsyncIterator[client.CustomObjectsApi]:
    async with ApiServer() as server:
        configuration = client.Configuration()
        await config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(server.write_kubeconfig(tmp_path / "kubeconfig")),
            client_configuration=configuration,
        )
        async with client.ApiClient(configuration) as api:
            definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
            await client.ApiextensionsV1Api(api).create_custom_resource_definition(definition)
            yield client.CustomObjectsApi(api)


async def create(custom: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    created = await custom.create_cluster_custom_object(
        specs.GROUP, specs.VERSION, specs.PLURAL, body
    )
    assert isinstance(created, dict)
    return created


async def test_a_valid_policy_is_stored_with_the_models_defaults(
    custom: client.CustomObjectsApi,
) -> None:
    spec = {
        "driver": {"gpu": {"version": "580.105.08", "source": "https://mirror.example/d"}},
        "upgradePolicy": {"maxParallelUpgrades": 4, "maxUnavailable": "25%"},
    }

    created = await create(custom, policy(spec))

    expected = validate_spec(spec)
    assert created["spec"] == expected.to_wire()
    assert validate_spec(created["spec"]) == expected
    assert created["spec"]["upgradePolicy"]["deadlines"]["driverInstall"] == 900


async def test_an_integer_max_unavailable_is_accepted(custom: client.CustomObjectsApi) -> None:
    spec = {"driver": {"gpu": {"version": "580"}}, "upgradePolicy": {"maxUnavailable": 2}}

    created = await create(custom, policy(spec))

    assert created["spec"]["upgradePolicy"]["maxUnavailable"] == 2


@pytest.mark.parametrize(
    ("upgrade_policy", "field"),
    [
        ({"maxParallelUpgrades": "four"}, "spec.upgradePolicy.maxParallelUpgrades"),
        ({"drain": {"enable": "yes"}}, "spec.upgradePolicy.drain.enable"),
        ({"maxUnavailable": True}, "spec.upgradePolicy.maxUnavailable"),
        ({"maxUnavailable": "0%"}, "spec.upgradePolicy.maxUnavailable"),
        ({"deadlines": {"reboot": 0}}, "spec.upgradePolicy.deadlines.reboot"),
    ],
)
async def test_a_wrong_type_or_bound_is_refused_with_422(
    custom: client.CustomObjectsApi, upgrade_policy: dict[str, Any], field: str
) -> None:
    spec = {"driver": {"gpu": {"version": "580"}}, "upgradePolicy": upgrade_policy}

    with pytest.raises(client.ApiException) as refused:
        await create(custom, policy(spec))

    status = json.loads(refused.value.body or "{}")
    assert refused.value.status == 422
    assert status["reason"] == "Invalid"
    assert [cause["field"] for cause in status["details"]["causes"]] == [field]


async def test_a_policy_without_a_gpu_version_is_refused(custom: client.CustomObjectsApi) -> None:
    with pytest.raises(client.ApiException) as refused:
        await create(custom, policy({"driver": {"gpu": {}}}))

    assert refused.value.status == 422
    assert "spec.driver.gpu.version" in json.loads(refused.value.body or "{}")["message"]


async def test_the_status_subresource_stores_what_the_model_writes(
    custom: client.CustomObjectsApi,
) -> None:
    await create(custom, policy({"driver": {"gpu": {"version": "580"}}}))
    status = PolicyStatus(
        observed_generation=1,
        conditions=(
            valid_condition(now=NOW, observed_generation=1),
            condition(ConditionType.READY, False, "RolloutInProgress", "1 of 4 nodes", now=NOW),
        ),
        nodes={"upgrade-done": 1, "upgrade-required": 3},
    )

    written = await custom.patch_cluster_custom_object_status(
        specs.GROUP, specs.VERSION, specs.PLURAL, "cluster-policy", {"status": status.to_wire()}
    )

    assert isinstance(written, dict)
    assert PolicyStatus.model_validate(written["status"]) == status


async def test_a_network_section_is_stored_with_the_models_defaults(
    custom: client.CustomObjectsApi,
) -> None:
    spec = {
        "driver": {"gpu": {"version": "580"}},
        "network": {
            "networks": [
                {
                    "name": "roce-a",
                    "master": {"vendors": ["15b3"], "drivers": ["mlx5_core"]},
                    "mtu": 9000,
                    "ipam": {"cidr": "192.168.100.0/24", "rangeStart": "192.168.100.10"},
                }
            ],
            "rdmaSharedDevices": [
                {"resourceName": "roce_shared", "selectors": {"vendors": ["15b3"]}}
            ],
        },
    }

    created = await create(custom, policy(spec))

    expected = validate_spec(spec)
    assert created["spec"] == expected.to_wire()
    assert created["spec"]["network"]["networks"][0]["namespace"] == "default"
    assert created["spec"]["network"]["allowManagementNicReload"] is False


async def test_a_wrong_network_type_is_refused_with_422_naming_the_field(
    custom: client.CustomObjectsApi,
) -> None:
    network = {"name": "roce-a", "master": {"interface": "eth1"}, "mtu": "9000"}
    spec = {
        "driver": {"gpu": {"version": "580"}},
        "network": {"networks": [{**network, "ipam": {"cidr": "10.0.0.0/24"}}]},
    }

    with pytest.raises(client.ApiException) as refused:
        await create(custom, policy(spec))

    status = json.loads(refused.value.body or "{}")
    assert refused.value.status == 422
    assert [cause["field"] for cause in status["details"]["causes"]] == [
        "spec.network.networks[0].mtu"
    ]


async def test_more_than_sixteen_pools_are_refused_by_the_api_server(
    custom: client.CustomObjectsApi,
) -> None:
    pools = [
        {"name": f"pool-{n}", "nodeSelector": f"pool={n}", "gpu": {"version": "580"}}
        for n in range(17)
    ]
    spec = {"driver": {"gpu": {"version": "580"}, "pools": pools}}

    with pytest.raises(client.ApiException) as refused:
        await create(custom, policy(spec))

    status = json.loads(refused.value.body or "{}")
    assert refused.value.status == 422
    assert [cause["field"] for cause in status["details"]["causes"]] == ["spec.driver.pools"]
