"""What kubectl 1.37 needs of the API server beyond the REST verbs, without kubectl: TLS
with a CA in the kubeconfig, kube-apiserver 1.37.2's /version, the OpenAPI v2 and v3
documents (read here the way `kubectl explain` and `kubectl apply` read them), and the
access reviews behind `kubectl auth can-i`, with the authorizer they report enforced."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import re
import ssl
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from gpuop_sim import ApiServer
from gpuop_sim.apiserver import certificates, discovery, kinds
from gpuop_sim.apiserver import kubeconfig as kubeconfigs
from gpuop_sim.apiserver.authorizing import Rule
from gpuop_sim.cluster import machines
from tests.integration.sim.clusters import official_client
from tests.integration.sim.support import RawApi, node

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[3]
POLICY_CRD = REPO / "deploy/crds/gpuclusterpolicies.gpuop.io.yaml"
POLICY = REPO / "deploy/examples/gpuclusterpolicy.yaml"
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SAR = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
PROTOBUF = "application/vnd.kubernetes.protobuf"
VIEWER_RULES = [Rule(("get", "list", "watch"), ("",), ("nodes",))]
HASH = re.compile(r"^[0-9A-F]{128}$")


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _tls_only(server: ApiServer) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=server.ssl_context()))


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# TLS


async def test_the_server_speaks_only_https(server: ApiServer, raw: RawApi) -> None:
    plain = server.url.replace("https://", "http://", 1)

    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"{plain}/version", headers=_bearer(server.token)) as answer:
                await answer.read()
    status, _, _ = await raw.request("GET", "/version")

    assert server.url.startswith("https://127.0.0.1:")
    assert status == 200


async def test_a_client_trusting_another_ca_or_only_the_system_cas_is_refused(
    server: ApiServer,
) -> None:
    async with ApiServer() as other:
        strangers = [other.ssl_context(), ssl.create_default_context()]
    refused = []
    for context in strangers:
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(connector=connector) as session:
            try:
                async with session.get(f"{server.url}/version") as answer:
                    refused.append(answer.status)
            except aiohttp.ClientConnectorCertificateError as error:
                refused.append(type(error).__name__)

    assert refused == ["ClientConnectorCertificateError"] * 2


async def test_the_official_client_refuses_a_kubeconfig_without_the_ca(
    server: ApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    written = _yaml(kubeconfig)
    del written["clusters"][0]["cluster"]["certificate-authority-data"]
    no_ca = tmp_path / "no-ca"
    no_ca.write_text(yaml.safe_dump(written))

    async with official_client(no_ca) as api:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.CoreV1Api(api).list_namespace()


async def test_the_kubeconfig_carries_the_ca_an_https_url_and_the_token(
    server: ApiServer, kubeconfig: Path
) -> None:
    written = _yaml(kubeconfig)
    cluster = written["clusters"][0]["cluster"]

    async with official_client(kubeconfig) as api:
        names = [n.metadata.name for n in (await client.CoreV1Api(api).list_namespace()).items]
        host = api.configuration.host
    trusting = aiohttp.TCPConnector(ssl=kubeconfigs.ssl_context(kubeconfig))
    async with (
        aiohttp.ClientSession(connector=trusting) as session,
        session.get(f"{host}/version", headers=_bearer(server.token)) as answer,
    ):
        version_status = answer.status

    assert cluster["server"] == server.url == host
    assert base64.b64decode(cluster["certificate-authority-data"]) == server.ca_pem
    assert written["users"][0]["user"] == {"token": server.token}
    assert "default" in names
    assert version_status == 200


async def _peer_certificate(server: ApiServer, name: str) -> bytes:
    """The certificate the server presents to a client that checks it for ``name``."""
    port = int(server.url.rpartition(":")[2])
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=server.ssl_context(), server_hostname=name
    )
    try:
        certificate: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return certificate
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_serving_certificate_names_loopback_and_is_signed_by_the_ca(
    server: ApiServer,
) -> None:
    peer = await _peer_certificate(server, "127.0.0.1")
    by_name = await _peer_certificate(server, "localhost")

    certificate = x509.load_der_x509_certificate(peer)
    ca = x509.load_pem_x509_certificate(server.ca_pem)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    certificate.verify_directly_issued_by(ca)
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert by_name == peer


def test_a_host_bound_beyond_loopback_is_named_in_the_certificate_too() -> None:
    def names(host: str) -> set[str]:
        issued = certificates.issue(host)
        certificate = x509.load_pem_x509_certificate(issued.certificate_pem)
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        alternatives = extension.value
        return {str(v) for v in alternatives.get_values_for_type(x509.IPAddress)} | set(
            alternatives.get_values_for_type(x509.DNSName)
        )

    assert names("127.0.0.1") == {"127.0.0.1", "::1", "localhost"}
    assert names("10.1.2.3") == {"127.0.0.1", "::1", "localhost", "10.1.2.3"}
    assert names("gpu-host.example") == {"127.0.0.1", "::1", "localhost", "gpu-host.example"}


async def test_the_key_is_left_in_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))

    async with ApiServer() as running:
        left = list(temporary.rglob("*"))
        ca = running.ca_pem

    assert left == []
    assert ca.startswith(b"-----BEGIN CERTIFICATE-----")


# /version


async def test_version_is_kube_apiserver_1_37_2s_with_the_sim_named_in_git_commit(
    raw: RawApi, api: client.ApiClient
) -> None:
    status, body, headers = await raw.request("GET", "/version")
    info = await client.VersionApi(api).get_code()

    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "major": "1",
        "minor": "37",
        "emulationMajor": "1",
        "emulationMinor": "37",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "36",
        "gitVersion": "v1.37.2",
        "gitCommit": "gpuop-sim",
        "gitTreeState": "clean",
        "buildDate": body["buildDate"],
        "goVersion": body["goVersion"],
        "compiler": "gc",
        "platform": "linux/amd64",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", body["buildDate"])
    assert re.fullmatch(r"go1\.\d+\.\d+", body["goVersion"])
    assert (info.git_version, info.major, info.minor) == ("v1.37.2", "1", "37")


def test_the_version_is_one_constant_the_kubelets_report_too() -> None:
    assert discovery.KUBERNETES_VERSION == "v1.37.2"
    assert discovery.version()["gitVersion"] is discovery.KUBERNETES_VERSION
    assert machines.KUBELET_VERSION is discovery.KUBERNETES_VERSION


# OpenAPI, read as kubectl reads it


def _schema_of(document: Obj, group: str, version: str, kind: str) -> Obj:
    """The schema `kubectl explain` finds: the one whose GVK list names the kind."""
    wanted = {"group": group, "version": version, "kind": kind}
    found = [
        schema
        for schema in document["components"]["schemas"].values()
        if wanted in schema.get("x-kubernetes-group-version-kind", [])
    ]
    assert len(found) == 1, f"{len(found)} schemas for {wanted}"
    return found[0]


def _resolved(document: Obj, schema: Obj) -> Obj:
    """Follow a ``$ref``, or an ``allOf`` of one, as the explain template does."""
    while True:
        if "$ref" in schema:
            name = schema["$ref"].removeprefix("#/components/schemas/")
            schema = document["components"]["schemas"][name]
        elif len(schema.get("allOf", [])) == 1 and "properties" not in schema:
            schema = schema["allOf"][0]
        else:
            return schema


def _field(document: Obj, schema: Obj, path: str) -> Obj:
    for name in path.split("."):
        schema = _resolved(document, schema)["properties"][name]
    return schema


def _patch_of(document: Obj, gvk: Obj) -> Obj:
    """The PATCH operation of a kind, as kubectl's field validation check finds it."""
    found = [
        item["patch"]
        for item in document["paths"].values()
        if "patch" in item and item["patch"]["x-kubernetes-group-version-kind"] == gvk
    ]
    assert found, f"no PATCH operation for {gvk}"
    return found[0]


async def _discovery(raw: RawApi) -> Obj:
    status, body, headers = await raw.request("GET", "/openapi/v3")
    assert (status, headers["Content-Type"]) == (200, "application/json")
    return body


async def _document(raw: RawApi, key: str) -> tuple[Obj, bytes, Any]:
    url = (await _discovery(raw))["paths"][key]["serverRelativeURL"]
    async with raw.session.get(raw.url + url, headers=_bearer(raw.token)) as answer:
        assert answer.status == 200
        data = await answer.read()
        return json.loads(data), data, answer.headers


async def _create_policy_crd(api: client.ApiClient) -> None:
    crd = _yaml(POLICY_CRD)
    await client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)


async def test_openapi_v3_lists_each_group_version_at_the_hash_of_its_document(
    raw: RawApi,
) -> None:
    listed = (await _discovery(raw))["paths"]
    document, data, headers = await _document(raw, "apis/policy/v1")
    url = listed["apis/policy/v1"]["serverRelativeURL"]

    assert {
        "api/v1",
        "apis/policy/v1",
        "apis/coordination.k8s.io/v1",
        "apis/apiextensions.k8s.io/v1",
        "apis/authorization.k8s.io/v1",
    } <= set(listed)
    for key, entry in listed.items():
        prefix, _, digest = entry["serverRelativeURL"].partition("?hash=")
        assert prefix == f"/openapi/v3/{key}" and HASH.match(digest), entry
    assert url.endswith("?hash=" + hashlib.sha512(data).hexdigest().upper())
    assert headers["Content-Type"] == "application/json"
    assert document["openapi"].startswith("3.")
    assert document["info"]["version"] == "v1.37.2"


async def test_built_in_kinds_carry_their_gvk_and_object_metadata(raw: RawApi) -> None:
    document, _, _ = await _document(raw, "api/v1")
    pod = _schema_of(document, "", "v1", "Pod")
    labels = _field(document, pod, "metadata.labels")
    pod_list = _schema_of(document, "", "v1", "PodList")

    assert document["components"]["schemas"]["io.k8s.api.core.v1.Pod"] is not None
    assert pod["x-kubernetes-preserve-unknown-fields"] is True
    assert pod["description"].startswith("Pod is a collection of containers")
    assert _resolved(document, pod["properties"]["metadata"])["properties"]["name"]
    assert labels["type"] == "object"
    assert labels["additionalProperties"]["type"] == "string"
    assert _resolved(document, pod_list["properties"]["items"]["items"]) is pod
    assert "io.k8s.api.policy.v1.Eviction" in document["components"]["schemas"]


async def test_patches_take_field_validation_so_kubectl_leaves_it_to_the_server(
    raw: RawApi,
) -> None:
    core, _, _ = await _document(raw, "api/v1")
    crds, _, _ = await _document(raw, "apis/apiextensions.k8s.io/v1")
    pod_patch = _patch_of(core, {"group": "", "version": "v1", "kind": "Pod"})
    crd_gvk = {"group": "apiextensions.k8s.io", "version": "v1", "kind": "CustomResourceDefinition"}
    crd_patch = _patch_of(crds, crd_gvk)
    namespaced = core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]

    for patch in (pod_patch, crd_patch):
        assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
        # No strategic merge on offer: kubectl then patches built-ins with its own schemas.
        # Server-side apply is, with its force parameter.
        assert set(patch["requestBody"]["content"]) == {
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        }
        assert "force" in {p["name"] for p in patch["parameters"]}
    assert {p["name"] for p in namespaced["parameters"]} == {"name", "namespace"}
    assert namespaced["get"]["operationId"] == "readCoreV1NamespacedPod"
    assert "/api/v1/pods" in core["paths"]  # every namespace's pods, for explain's lookup


async def test_a_crds_schema_is_published_for_explain_once_it_is_served(
    raw: RawApi, api: client.ApiClient
) -> None:
    before = (await _discovery(raw))["paths"]
    await _create_policy_crd(api)
    after = (await _discovery(raw))["paths"]
    document, _, _ = await _document(raw, "apis/gpuop.io/v1alpha1")
    policy = _schema_of(document, "gpuop.io", "v1alpha1", "GPUClusterPolicy")
    crd = _yaml(POLICY_CRD)
    written = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    max_unavailable = _field(document, policy, "spec.upgradePolicy.maxUnavailable")
    path = "/apis/gpuop.io/v1alpha1/gpuclusterpolicies/{name}"

    assert "apis/gpuop.io/v1alpha1" not in before
    assert "apis/gpuop.io/v1alpha1" in after
    assert "io.gpuop.v1alpha1.GPUClusterPolicy" in document["components"]["schemas"]
    assert "io.gpuop.v1alpha1.GPUClusterPolicyList" in document["components"]["schemas"]
    assert policy["properties"]["spec"] == written["properties"]["spec"]
    assert policy["description"] == written["description"]
    assert (
        max_unavailable
        == (
            written["properties"]["spec"]["properties"]["upgradePolicy"]["properties"][
                "maxUnavailable"
            ]
        )
    )
    assert _resolved(document, policy["properties"]["metadata"])["properties"]["labels"]
    assert document["paths"][path]["patch"]["x-kubernetes-group-version-kind"] == {
        "group": "gpuop.io",
        "version": "v1alpha1",
        "kind": "GPUClusterPolicy",
    }
    assert document["paths"][path]["parameters"][0]["name"] == "name"


async def test_the_example_policy_goes_in_as_kubectl_apply_sends_it_with_strict_validation(
    raw: RawApi, api: client.ApiClient
) -> None:
    await _create_policy_crd(api)
    policy = _yaml(POLICY)
    applied = json.dumps(policy, separators=(",", ":"))
    policy["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": applied
    }
    strict = {"fieldManager": "kubectl-client-side-apply", "fieldValidation": "Strict"}
    collection = "/apis/gpuop.io/v1alpha1/gpuclusterpolicies"

    missing, _, _ = await raw.request("GET", f"{collection}/gpu-cluster-policy")
    created, body, _ = await raw.request("POST", collection, policy, params=strict)
    patched, again, _ = await raw.request(
        "PATCH",
        f"{collection}/gpu-cluster-policy",
        {"spec": {"upgradePolicy": {"paused": True}}},
        content_type="application/merge-patch+json",
        params=strict,
    )

    assert (missing, created, patched) == (404, 201, 200)
    assert body["spec"]["driver"]["gpu"]["version"] == "580.105.08"
    assert again["spec"]["upgradePolicy"]["paused"] is True


async def test_a_document_asked_for_by_its_hash_is_cached_for_good_and_revalidates(
    raw: RawApi, api: client.ApiClient
) -> None:
    url = (await _discovery(raw))["paths"]["apis/apiextensions.k8s.io/v1"]["serverRelativeURL"]
    digest = url.partition("?hash=")[2]
    headers = _bearer(raw.token)
    async with raw.session.get(raw.url + url, headers=headers) as hashed:
        cached = dict(hashed.headers)
    unhashed_url = url.partition("?")[0]
    async with raw.session.get(raw.url + unhashed_url, headers=headers) as unhashed:
        fresh = dict(unhashed.headers)
    etag = {**headers, "If-None-Match": f'"{digest}"'}
    async with raw.session.get(raw.url + unhashed_url, headers=etag) as revalidated:
        not_modified, empty = revalidated.status, await revalidated.read()
    stale = f"{unhashed_url}?hash={'0' * 128}"
    async with raw.session.get(raw.url + stale, headers=headers, allow_redirects=False) as moved:
        redirect = (moved.status, moved.headers["Location"])

    assert (cached["Etag"], cached["Cache-Control"], cached["Vary"]) == (
        f'"{digest}"',
        "public, immutable",
        "Accept",
    )
    assert cached["Expires"].endswith(" GMT")
    assert fresh["Etag"] == f'"{digest}"' and "Cache-Control" not in fresh
    assert (not_modified, empty) == (304, b"")
    assert redirect == (301, url)


async def test_a_crd_changes_the_hash_of_its_group_version_only(
    raw: RawApi, api: client.ApiClient
) -> None:
    await _create_policy_crd(api)
    before = (await _discovery(raw))["paths"]
    crd = _yaml(POLICY_CRD)
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "Changed."
    extensions = client.ApiextensionsV1Api(api)
    current = await extensions.read_custom_resource_definition(crd["metadata"]["name"])
    crd["metadata"]["resourceVersion"] = current.metadata.resource_version
    await extensions.replace_custom_resource_definition(crd["metadata"]["name"], crd)
    after = (await _discovery(raw))["paths"]
    await extensions.delete_custom_resource_definition(crd["metadata"]["name"])
    gone = (await _discovery(raw))["paths"]

    changed = {key for key in after if after[key] != before.get(key)}
    assert changed == {"apis/gpuop.io/v1alpha1"}
    assert "apis/gpuop.io/v1alpha1" not in gone


async def test_unknown_openapi_paths_are_404(raw: RawApi) -> None:
    headers = _bearer(raw.token)
    answers = []
    for path in ("/openapi/v3/apis/nothing.example/v1", "/openapi/v3/", "/openapi/v4"):
        async with raw.session.get(raw.url + path, headers=headers) as answer:
            answers.append((answer.status, await answer.read()))

    # kube-aggregator answers an unknown group-version with an empty 404; other paths get
    # the usual Status.
    assert answers[0] == (404, b"") and answers[1] == (404, b"")
    assert answers[2][0] == 404
    assert json.loads(answers[2][1])["reason"] == "NotFound"


async def test_openapi_needs_credentials(raw: RawApi) -> None:
    status, body, _ = await raw.request("GET", "/openapi/v3", authenticated=False)
    assert (status, body["reason"]) == (401, "Unauthorized")


async def test_openapi_v2_is_one_json_document_and_only_json(raw: RawApi) -> None:
    headers = _bearer(raw.token)
    async with raw.session.get(raw.url + "/openapi/v2", headers=headers) as answer:
        status, content_type, etag = answer.status, answer.content_type, answer.headers["Etag"]
        swagger = await answer.json()
    protobuf_only = {
        **headers,
        "Accept": "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
    }
    async with raw.session.get(raw.url + "/openapi/v2", headers=protobuf_only) as refused:
        refused_status = refused.status
    either = {**protobuf_only, "Accept": protobuf_only["Accept"] + ", application/json"}
    async with raw.session.get(raw.url + "/openapi/v2", headers=either) as fallback:
        fallback_type = fallback.content_type

    pod = swagger["definitions"]["io.k8s.api.core.v1.Pod"]
    assert (status, content_type) == (200, "application/json")
    assert HASH.match(etag.strip('"'))
    assert swagger["swagger"] == "2.0"
    assert swagger["info"]["version"] == "v1.37.2"
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Pod", "version": "v1"}]
    assert pod["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]
    assert "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets" in swagger["paths"]
    assert refused_status == 406
    assert fallback_type == "application/json"


# Access reviews and the authorizer behind them


async def _review(
    raw: RawApi, body: Any, *, token: str | None = None, path: str = SSAR
) -> tuple[int, Obj]:
    headers = {**_bearer(token or raw.token), "Content-Type": "application/json"}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with raw.session.post(raw.url + path, data=data, headers=headers) as answer:
        return answer.status, await answer.json(content_type=None)


def _can(verb: str, resource: str, **more: str) -> Obj:
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "resource": resource, **more}},
    }


async def test_can_i_list_nodes_is_yes_for_the_admin(raw: RawApi, api: client.ApiClient) -> None:
    review = await client.AuthorizationV1Api(api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "list", "resource": "nodes"}}}
    )
    status, body = await _review(
        raw, _can("delete", "customresourcedefinitions", group="apiextensions.k8s.io")
    )

    assert review.status.allowed is True
    assert review.kind == "SelfSubjectAccessReview"
    assert (status, body["status"]) == (201, {"allowed": True})
    assert body["spec"]["resourceAttributes"]["resource"] == "customresourcedefinitions"


async def test_a_non_admin_is_told_and_held_to_what_its_rules_allow(
    server: ApiServer, raw: RawApi
) -> None:
    viewer = server.add_user("viewer", VIEWER_RULES)
    server.seed(node("node-1"))
    list_nodes = await _review(raw, _can("list", "nodes"), token=viewer)
    delete_nodes = await _review(raw, _can("delete", "nodes"), token=viewer)
    list_pods = await _review(raw, _can("list", "pods", namespace="default"), token=viewer)
    as_viewer = RawApi(server.url, viewer, server.ssl_context())
    async with as_viewer:
        listed, _, _ = await as_viewer.request("GET", "/api/v1/nodes")
        deleted, refusal, headers = await as_viewer.request("DELETE", "/api/v1/nodes/node-1")
        pods, pods_refusal, _ = await as_viewer.request("GET", "/api/v1/namespaces/default/pods")

    assert [r[1]["status"]["allowed"] for r in (list_nodes, delete_nodes, list_pods)] == [
        True,
        False,
        False,
    ]
    assert (listed, deleted, pods) == (200, 403, 403)
    assert headers["Content-Type"] == "application/json"
    assert refusal == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'nodes "node-1" is forbidden: User "viewer" cannot delete resource "nodes" '
        'in API group "" at the cluster scope',
        "reason": "Forbidden",
        "details": {"name": "node-1", "kind": "nodes"},
        "code": 403,
    }
    assert pods_refusal["message"] == (
        'pods is forbidden: User "viewer" cannot list resource "pods" in API group "" in the '
        'namespace "default"'
    )
    assert server.store.get(kinds.NODES.group_resource, "", "node-1") is not None


async def test_every_user_may_discover_and_review_itself_but_no_more(
    server: ApiServer, raw: RawApi
) -> None:
    nobody = server.add_user("nobody")
    async with RawApi(server.url, nobody, server.ssl_context()) as as_nobody:
        discovered = [
            (await as_nobody.request("GET", path))[0]
            for path in ("/api", "/apis", "/api/v1", "/version", "/openapi/v3")
        ]
        nodes, _, _ = await as_nobody.request("GET", "/api/v1/nodes")
        metrics, refusal, _ = await as_nobody.request("GET", "/metrics")
    own = await _review(raw, _can("get", "pods"), token=nobody)
    about_others = await _review(
        raw,
        {"spec": {"user": "viewer", "resourceAttributes": {"verb": "get", "resource": "pods"}}},
        token=nobody,
        path=SAR,
    )

    assert discovered == [200] * 5
    assert (nodes, metrics) == (403, 403)
    assert refusal["message"] == 'forbidden: User "nobody" cannot get path "/metrics"'
    assert (own[0], own[1]["status"]["allowed"]) == (201, False)
    assert about_others[0] == 403


async def test_a_subject_access_review_judges_the_named_user_and_groups(
    server: ApiServer, raw: RawApi, api: client.ApiClient
) -> None:
    server.add_user("viewer", VIEWER_RULES)
    authorization = client.AuthorizationV1Api(api)

    async def allowed(user: str, verb: str, groups: list[str] | None = None) -> bool:
        spec: Obj = {"resourceAttributes": {"verb": verb, "resource": "nodes"}, "user": user}
        if groups is not None:
            spec["groups"] = groups
        review = await authorization.create_subject_access_review({"spec": spec})
        return bool(review.status.allowed)

    answers = [
        await allowed("viewer", "watch"),
        await allowed("viewer", "delete"),
        await allowed("someone", "delete", ["system:masters"]),
        await allowed("gpuop-sim-admin", "delete"),  # its power comes from its group
    ]
    local = await authorization.create_namespaced_local_subject_access_review(
        "default",
        {
            "metadata": {"namespace": "default"},
            "spec": {
                "user": "viewer",
                "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "default"},
            },
        },
    )

    assert answers == [True, False, True, False]
    assert local.status.allowed is False


async def test_malformed_reviews_are_400_and_incomplete_ones_422(raw: RawApi) -> None:
    not_json = await _review(raw, b"{not json")
    not_object = await _review(raw, [1, 2])
    bad_attributes = await _review(raw, {"spec": {"resourceAttributes": "list nodes"}})
    neither = await _review(raw, {"spec": {}})
    both = await _review(
        raw,
        {"spec": {"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"verb": "get"}}},
    )
    no_subject = await _review(
        raw, {"spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}}, path=SAR
    )

    assert [r[0] for r in (not_json, not_object, bad_attributes)] == [400, 400, 400]
    assert {r[1]["reason"] for r in (not_json, not_object, bad_attributes)} == {"BadRequest"}
    assert (neither[0], neither[1]["reason"]) == (422, "Invalid")
    assert neither[1]["message"] == (
        'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec: Invalid value: null: '
        "exactly one of nonResourceAttributes or resourceAttributes must be specified"
    )
    assert neither[1]["details"]["causes"][0]["field"] == "spec"
    assert both[0] == 422
    assert no_subject[0] == 422
    assert (
        'spec.user: Invalid value: "": at least one of user or group must be specified'
        in (no_subject[1]["message"])
    )


async def test_reviews_are_only_created_never_stored(server: ApiServer, raw: RawApi) -> None:
    listed, _, _ = await raw.request("GET", SSAR)
    named, _, _ = await raw.request("GET", f"{SSAR}/mine")
    created, _ = await _review(raw, _can("get", "pods"))

    assert (listed, named, created) == (405, 404, 201)
    assert server.store.view(kinds.SELFSUBJECTACCESSREVIEWS.group_resource) == []


async def test_discovery_lists_authorization_and_authentication(raw: RawApi) -> None:
    _, groups, _ = await raw.request("GET", "/apis")
    _, authorization, _ = await raw.request("GET", "/apis/authorization.k8s.io/v1")
    _, authentication, _ = await raw.request("GET", "/apis/authentication.k8s.io/v1")

    names = {group["name"]: group["preferredVersion"] for group in groups["groups"]}
    resources = {entry["name"]: entry for entry in authorization["resources"]}
    assert names["authorization.k8s.io"]["groupVersion"] == "authorization.k8s.io/v1"
    assert set(resources) == {
        "localsubjectaccessreviews",
        "selfsubjectaccessreviews",
        "selfsubjectrulesreviews",
        "subjectaccessreviews",
    }
    assert all(entry["verbs"] == ["create"] for entry in resources.values())
    assert resources["localsubjectaccessreviews"]["namespaced"] is True
    assert resources["selfsubjectaccessreviews"]["kind"] == "SelfSubjectAccessReview"
    assert [e["name"] for e in authentication["resources"]] == ["selfsubjectreviews"]


async def test_rules_review_and_whoami_describe_the_caller(
    server: ApiServer, raw: RawApi, api: client.ApiClient
) -> None:
    viewer = server.add_user("viewer", VIEWER_RULES, groups=["gpu-team"])
    rules_path = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
    status, rules = await _review(
        raw, {"spec": {"namespace": "default"}}, token=viewer, path=rules_path
    )
    no_namespace = await _review(raw, {"spec": {}}, token=viewer, path=rules_path)
    whoami = await client.AuthenticationV1Api(api).create_self_subject_review({})

    assert status == 201
    assert rules["status"]["resourceRules"][0] == {
        "verbs": ["get", "list", "watch"],
        "apiGroups": [""],
        "resources": ["nodes"],
    }
    assert any("/version" in r["nonResourceURLs"] for r in rules["status"]["nonResourceRules"])
    assert rules["status"]["incomplete"] is False
    assert (no_namespace[0], no_namespace[1]["message"]) == (400, "no namespace on request")
    assert whoami.status.user_info.username == "gpuop-sim-admin"
    assert "system:masters" in whoami.status.user_info.groups


async def test_anonymous_requests_are_system_anonymous_and_allowed_only_when_enabled(
    tmp_path: Path,
) -> None:
    async with ApiServer(anonymous_auth=True) as open_server:
        question = _can("delete", "nodes")
        async with (
            _tls_only(open_server) as session,
            session.post(open_server.url + SSAR, json=question) as answer,
        ):
            anonymous = (answer.status, (await answer.json())["status"])
        open_server.anonymous_auth = False
        async with (
            _tls_only(open_server) as session,
            session.post(open_server.url + SSAR, json=question) as answer,
        ):
            closed = answer.status

    assert anonymous == (201, {"allowed": True})
    assert closed == 401


# Protobuf request bodies, as client-go's typed clients (kubectl auth can-i) send them


def _varint(value: int) -> bytes:
    encoded = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        encoded.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(encoded)


def _bytes_field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _protobuf(api_version: str, kind: str, message: bytes) -> bytes:
    type_meta = _bytes_field(1, api_version) + _bytes_field(2, kind)
    return b"k8s\x00" + _bytes_field(1, type_meta) + _bytes_field(2, message)


async def _post(raw: RawApi, path: str, body: bytes, content_type: str) -> tuple[int, Obj]:
    headers = {**_bearer(raw.token), "Content-Type": content_type, "Accept": f"{PROTOBUF}, */*"}
    async with raw.session.post(raw.url + path, data=body, headers=headers) as answer:
        assert answer.content_type == "application/json"
        return answer.status, await answer.json()


async def test_protobuf_reviews_and_evictions_are_read_as_kubectl_sends_them(
    server: ApiServer, raw: RawApi
) -> None:
    attributes = _bytes_field(2, "list") + _bytes_field(5, "nodes")
    spec = _bytes_field(1, attributes)
    review = _protobuf("authorization.k8s.io/v1", "SelfSubjectAccessReview", _bytes_field(2, spec))
    server.seed(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
    )
    meta = _bytes_field(1, "p") + _bytes_field(3, "default")
    eviction = _protobuf("policy/v1", "Eviction", _bytes_field(1, meta))

    reviewed = await _post(raw, SSAR, review, PROTOBUF)
    evicted = await _post(raw, "/api/v1/namespaces/default/pods/p/eviction", eviction, PROTOBUF)
    garbled = await _post(raw, SSAR, b"k8s\x00\x0a\xff", PROTOBUF)
    not_protobuf = await _post(raw, SSAR, b"{}", PROTOBUF)
    pod = _protobuf("v1", "Pod", meta)
    unreadable = await _post(raw, "/api/v1/namespaces/default/pods", pod, PROTOBUF)

    assert reviewed[0] == 201
    assert reviewed[1]["status"] == {"allowed": True}
    assert reviewed[1]["spec"] == {"resourceAttributes": {"verb": "list", "resource": "nodes"}}
    assert (evicted[0], evicted[1]["status"]) == (201, "Success")
    assert (garbled[0], not_protobuf[0]) == (400, 400)
    assert (unreadable[0], unreadable[1]["reason"]) == (415, "UnsupportedMediaType")


async def test_a_forbidden_eviction_is_refused_before_it_runs(
    server: ApiServer, raw: RawApi
) -> None:
    viewer = server.add_user("viewer", VIEWER_RULES)
    server.seed(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
    )
    eviction = {"metadata": {"name": "p", "namespace": "default"}}
    async with RawApi(server.url, viewer, server.ssl_context()) as as_viewer:
        status, body, _ = await as_viewer.request(
            "POST", "/api/v1/namespaces/default/pods/p/eviction", eviction
        )

    assert status == 403
    assert body["message"] == (
        'pods "p" is forbidden: User "viewer" cannot create resource "pods/eviction" in API '
        'group "" in the namespace "default"'
    )
    assert server.store.get(kinds.PODS.group_resource, "default", "p") is not None


async def test_the_official_client_gets_403_as_forbidden(server: ApiServer, tmp_path: Path) -> None:
    viewer = server.add_user("viewer", VIEWER_RULES)
    kubeconfig = server.write_kubeconfig(tmp_path / "kc")
    written = _yaml(kubeconfig)
    written["users"][0]["user"]["token"] = viewer
    kubeconfig.write_text(yaml.safe_dump(written))

    async with official_client(kubeconfig) as api:
        core = client.CoreV1Api(api)
        nodes = await core.list_node()
        with pytest.raises(ApiException) as refused:
            await core.list_namespaced_pod("default")

    assert nodes.items == []
    assert refused.value.status == 403
