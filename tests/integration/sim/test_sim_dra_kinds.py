"""DRA's published kinds (`resource.k8s.io/v1`): ResourceSlices, DeviceClasses,
DeviceTaintRules and ResourceClaimTemplates served, discovered, selected by the slice fields
the kubelet and drivers use, and refused where a real API server refuses them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.sim.support import RawApi

API = "/apis/resource.k8s.io/v1"
SLICES = f"{API}/resourceslices"
MERGE = "application/merge-patch+json"


def resource(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def device(name: str, **attributes: Any) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"type": {"string": "gpu"}, **attributes},
        "capacity": {"memory": {"value": "143771Mi"}},
    }


def resource_slice(
    name: str, node: str, *, driver: str = "gpu.nvidia.com", **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "nodeName": node,
        "devices": [device("gpu-0"), device("gpu-1")],
    }
    body.update(spec)
    return resource("ResourceSlice", name, body)


async def test_the_dra_kinds_are_discovered(raw: RawApi) -> None:
    _, resources, _ = await raw.request("GET", API)

    by_name = {entry["name"]: entry for entry in resources["resources"]}
    assert by_name["resourceslices"]["namespaced"] is False
    assert by_name["deviceclasses"]["kind"] == "DeviceClass"
    assert by_name["devicetaintrules"]["namespaced"] is False
    assert "devicetaintrules/status" in by_name
    assert by_name["resourceclaimtemplates"]["namespaced"] is True


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=node-1", ["a", "c"]),
        ("spec.driver=gpu.nvidia.com", ["a", "b"]),
        ("spec.pool.name=node-2", ["b"]),
        ("spec.nodeName=node-1,spec.driver=gpu.nvidia.com", ["a"]),
    ],
)
async def test_slices_are_selected_by_node_driver_and_pool(
    raw: RawApi, selector: str, expected: list[str]
) -> None:
    await raw.request("POST", SLICES, resource_slice("a", "node-1"))
    await raw.request("POST", SLICES, resource_slice("b", "node-2"))
    await raw.request("POST", SLICES, resource_slice("c", "node-1", driver="other.example.com"))

    status, listed, _ = await raw.request("GET", f"{SLICES}?fieldSelector={selector}")

    assert status == 200, listed
    assert [item["metadata"]["name"] for item in listed["items"]] == expected


async def test_the_kubelets_wipe_deletes_its_nodes_slices_only(raw: RawApi) -> None:
    await raw.request("POST", SLICES, resource_slice("a", "node-1"))
    await raw.request("POST", SLICES, resource_slice("b", "node-2"))

    status, _, _ = await raw.request("DELETE", f"{SLICES}?fieldSelector=spec.nodeName=node-1")

    assert status == 200
    _, listed, _ = await raw.request("GET", SLICES)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["b"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nodeName": None}, "exactly one of `nodeName`, `nodeSelector`, `allNodes`"),
        ({"allNodes": True}, "exactly one of `nodeName`, `nodeSelector`, `allNodes`"),
        ({"driver": ""}, "spec.driver: Required value"),
        (
            {"pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 0}},
            "must be greater than zero",
        ),
        ({"devices": [device(f"gpu-{i}") for i in range(129)]}, "must have at most 128 items"),
        ({"devices": [device("gpu-0"), device("gpu-0")]}, "spec.devices[1].name: Duplicate value"),
        ({"devices": [device("GPU_0")]}, "RFC 1123 label"),
        ({"devices": [device("gpu-0", driverVersion={"version": "580.159.04"})]}, "semver"),
        ({"devices": [device("gpu-0", uuid={"string": "x", "int": 1})]}, "exactly one value"),
        ({"devices": [device("gpu-0", **{"bad-name": {"int": 1}})]}, "C identifier"),
        (
            {"devices": [device("gpu-0", **{f"a{i}": {"int": i} for i in range(31)})]},
            "must not exceed 32",
        ),
    ],
)
async def test_an_invalid_slice_is_refused(
    raw: RawApi, change: dict[str, Any], message: str
) -> None:
    body = resource_slice("a", "node-1")
    body["spec"].update(change)
    body["spec"] = {key: value for key, value in body["spec"].items() if value is not None}

    status, answer, _ = await raw.request("POST", SLICES, body)

    assert status == 422, answer
    assert message in answer["message"]


async def test_a_slices_driver_pool_and_node_are_immutable(raw: RawApi) -> None:
    await raw.request("POST", SLICES, resource_slice("a", "node-1"))

    status, answer, _ = await raw.request(
        "PATCH", f"{SLICES}/a", {"spec": {"nodeName": "node-2"}}, content_type=MERGE
    )
    assert status == 422 and "spec.nodeName: Invalid value" in answer["message"]

    bumped = {"spec": {"pool": {"generation": 2}, "devices": [device("gpu-0")]}}
    status, answer, _ = await raw.request("PATCH", f"{SLICES}/a", bumped, content_type=MERGE)
    assert status == 200, answer
    assert answer["spec"]["pool"]["generation"] == 2


async def test_device_classes_need_their_selectors_expressions(raw: RawApi) -> None:
    good = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            "extendedResourceName": "nvidia.com/gpu",
        },
    }
    bad = {**good, "metadata": {"name": "mig.nvidia.com"}, "spec": {"selectors": [{"cel": {}}]}}

    created, _, _ = await raw.request("POST", f"{API}/deviceclasses", good)
    refused, answer, _ = await raw.request("POST", f"{API}/deviceclasses", bad)

    assert created == 201
    assert refused == 422 and "spec.selectors[0].cel.expression" in answer["message"]


async def test_device_taint_rules_take_the_device_taint_effects(raw: RawApi) -> None:
    def rule(name: str, effect: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"},
                "taint": {"key": "gpuop.io/quarantine", "effect": effect},
            },
        }

    created, _, _ = await raw.request("POST", f"{API}/devicetaintrules", rule("a", "NoSchedule"))
    refused, answer, _ = await raw.request(
        "POST", f"{API}/devicetaintrules", rule("b", "PreferNoSchedule")
    )

    assert created == 201
    assert refused == 422 and "spec.taint.effect: Unsupported value" in answer["message"]


TEMPLATES = f"{API}/namespaces/default/resourceclaimtemplates"
ONE_GPU = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}


def template(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return resource(
        "ResourceClaimTemplate", name, {"spec": {"devices": {"requests": list(requests)}}}
    )


async def test_a_claim_templates_spec_is_immutable(raw: RawApi) -> None:
    path = TEMPLATES
    status, _, _ = await raw.request("POST", path, template("one-gpu", ONE_GPU))
    assert status == 201

    changed = {"spec": template("one-gpu", {**ONE_GPU, "name": "two"})["spec"]}
    status, answer, _ = await raw.request("PATCH", f"{path}/one-gpu", changed, content_type=MERGE)
    assert status == 422 and "field is immutable" in answer["message"]

    no_class = template("no-class", {"name": "gpu", "exactly": {}})
    status, answer, _ = await raw.request("POST", path, no_class)
    assert status == 422 and "deviceClassName: Required value" in answer["message"]
