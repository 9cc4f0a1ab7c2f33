"""Status codes, reasons, messages and field causes, as kube-apiserver answers them."""

from __future__ import annotations

from tests.integration.kube_contract.conftest import Api, config_map, configmaps

CONFLICT = (
    'Operation cannot be fulfilled on configmaps "cm": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


async def test_creating_an_existing_name_is_409_already_exists(api: Api) -> None:
    assert (await api.request("POST", configmaps(api), config_map()))[0] == 201
    status, answer = await api.request("POST", configmaps(api), config_map())

    assert status == 409
    assert answer["reason"] == "AlreadyExists"
    assert answer["message"] == 'configmaps "cm" already exists'
    assert answer["details"] == {"name": "cm", "kind": "configmaps"}


async def test_a_missing_object_is_404_not_found(api: Api) -> None:
    status, answer = await api.request("GET", configmaps(api) + "/nope")

    assert (status, answer["kind"], answer["reason"]) == (404, "Status", "NotFound")
    assert answer["message"] == 'configmaps "nope" not found'


async def test_creating_in_a_missing_namespace_is_404(api: Api) -> None:
    path = "/api/v1/namespaces/no-such-namespace/configmaps"
    status, answer = await api.request("POST", path, config_map())

    assert (status, answer["reason"]) == (404, "NotFound")
    assert answer["message"] == 'namespaces "no-such-namespace" not found'


async def test_a_stale_update_is_409_conflict(api: Api) -> None:
    _, made = await api.request("POST", configmaps(api), config_map(k="1"))
    first = {**made, "data": {"k": "2"}}
    assert (await api.request("PUT", configmaps(api) + "/cm", first))[0] == 200
    stale = {**made, "data": {"k": "3"}}  # the resourceVersion read before the update
    status, answer = await api.request("PUT", configmaps(api) + "/cm", stale)

    assert (status, answer["reason"]) == (409, "Conflict")
    assert answer["message"] == CONFLICT


async def test_an_invalid_label_is_422_naming_the_field(api: Api) -> None:
    bad = config_map()
    bad["metadata"]["labels"] = {"tier": "not a valid value!"}
    status, answer = await api.request("POST", configmaps(api), bad)

    assert (status, answer["reason"]) == (422, "Invalid")
    causes = answer["details"]["causes"]
    assert [cause["field"] for cause in causes] == ["metadata.labels"]
    assert causes[0]["reason"] == "FieldValueInvalid"


async def test_an_update_naming_another_object_is_400(api: Api) -> None:
    _, made = await api.request("POST", configmaps(api), config_map())
    renamed = {**made, "metadata": {**made["metadata"], "name": "other"}}
    status, answer = await api.request("PUT", configmaps(api) + "/cm", renamed)

    assert (status, answer["reason"]) == (400, "BadRequest")
    assert answer["message"] == (
        "the name of the object (other) does not match the name on the URL (cm)"
    )


async def test_writes_advance_the_resource_version_and_a_no_op_keeps_it(api: Api) -> None:
    _, made = await api.request("POST", configmaps(api), config_map(k="1"))
    _, same = await api.request("PUT", configmaps(api) + "/cm", made)
    _, changed = await api.request("PUT", configmaps(api) + "/cm", {**made, "data": {"k": "2"}})

    assert same["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]
    assert int(changed["metadata"]["resourceVersion"]) > int(made["metadata"]["resourceVersion"])
    assert made["metadata"]["uid"] and made["metadata"]["creationTimestamp"].endswith("Z")


async def test_a_delete_whose_preconditions_do_not_match_is_409(api: Api) -> None:
    await api.request("POST", configmaps(api), config_map())
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-it"}}
    status, answer = await api.request("DELETE", configmaps(api) + "/cm", options)

    assert (status, answer["reason"]) == (409, "Conflict")
    uid = (await api.request("GET", configmaps(api) + "/cm"))[1]["metadata"]["uid"]
    assert answer["message"] == (
        'Operation cannot be fulfilled on ConfigMap "cm": the UID in the precondition '
        f"(not-it) does not match the UID in record ({uid}). The object might have been "
        "deleted and then recreated"
    )


async def test_a_delete_whose_resource_version_precondition_is_stale_is_409(api: Api) -> None:
    _, made = await api.request("POST", configmaps(api), config_map(k="1"))
    await api.request("PUT", configmaps(api) + "/cm", {**made, "data": {"k": "2"}})
    old = made["metadata"]["resourceVersion"]
    options = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"resourceVersion": old},
    }
    status, answer = await api.request("DELETE", configmaps(api) + "/cm", options)
    current = (await api.request("GET", configmaps(api) + "/cm"))[1]["metadata"]["resourceVersion"]

    assert (status, answer["reason"]) == (409, "Conflict")
    assert answer["message"] == (
        f'Operation cannot be fulfilled on ConfigMap "cm": the ResourceVersion in the '
        f"precondition ({old}) does not match the ResourceVersion in record ({current}). "
        "The object might have been modified"
    )


async def test_a_malformed_body_is_400(api: Api) -> None:
    status, answer = await api.request("POST", configmaps(api), "{not json")

    assert (status, answer["reason"]) == (400, "BadRequest")
