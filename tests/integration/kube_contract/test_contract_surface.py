"""What clients read before they act: the version, discovery, OpenAPI and access reviews
(kubectl's version skew check, `apply` validation, `explain` and `auth can-i`)."""

from __future__ import annotations

from tests.integration.kube_contract.conftest import Api


async def test_the_version_is_kubernetes_1_37(api: Api) -> None:
    status, version = await api.request("GET", "/version")

    assert status == 200
    assert (version["major"], version["minor"]) == ("1", "37")
    assert version["gitVersion"].startswith("v1.37.")
    assert version["platform"] == "linux/amd64"


async def test_discovery_lists_the_groups_gpuop_uses(api: Api) -> None:
    _, core = await api.request("GET", "/api")
    _, groups = await api.request("GET", "/apis")
    _, v1 = await api.request("GET", "/api/v1")

    assert core["versions"] == ["v1"]
    names = {group["name"] for group in groups["groups"]}
    # (the sim's ApiServer alone serves no batch/v1: SimCluster adds the workload kinds)
    expected = {"apps", "policy", "coordination.k8s.io", "apiextensions.k8s.io"}
    assert expected | {"authorization.k8s.io"} <= names
    resources = {resource["name"]: resource for resource in v1["resources"]}
    assert resources["pods/eviction"]["verbs"] == ["create"]
    assert resources["pods/eviction"]["kind"] == "Eviction"
    assert set(resources["nodes/status"]["verbs"]) == {"get", "patch", "update"}


async def test_openapi_v2_and_v3_are_served(api: Api) -> None:
    status_v2, v2 = await api.request("GET", "/openapi/v2")
    status_v3, v3 = await api.request("GET", "/openapi/v3")

    assert (status_v2, status_v3) == (200, 200)
    assert v2["swagger"] == "2.0"
    assert "io.k8s.api.core.v1.Pod" in v2["definitions"]
    assert "api/v1" in v3["paths"]
    document = v3["paths"]["api/v1"]["serverRelativeURL"]
    status, core = await api.request("GET", document)
    assert status == 200
    pod = core["components"]["schemas"]["io.k8s.api.core.v1.Pod"]
    assert {"group": "", "kind": "Pod", "version": "v1"} in pod["x-kubernetes-group-version-kind"]


async def test_a_self_subject_access_review_answers_for_the_caller(api: Api) -> None:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "list", "resource": "nodes"}},
    }
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    status, answer = await api.request("POST", path, review)

    assert status == 201
    assert answer["status"]["allowed"] is True
