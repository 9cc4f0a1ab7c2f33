"""The chart in callout mode (nats.auth.mode=callout) installed by the real Helm into the real
control plane: every object is accepted, the callout's ServiceAccount may create TokenReviews
and nothing of what no account may do, and with its own token it reviews a token the
driver-manager's ServiceAccount got for a pod on a KWOK node, which the account table the
chart gives the callout maps to that node's driver-manager."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import callouts, grants, nkeys
from gpuop.cli.natsauth import issuer_secret
from gpuop.kube import client as kubeclient
from gpuop.kube.tokenreviews import AUDIENCE, KubeTokenReviewer
from tests.support import fleet
from tests.support.callouts import authorization_request
from tests.support.chart_access import NEVER
from tests.support.control_plane import ControlPlane

pytestmark = [pytest.mark.real_cluster, pytest.mark.security]

NS = fleet.RELEASE_NAMESPACE
ISSUER = "gpuop-nats-issuer"


@pytest.fixture(scope="module")
def installed(plane: ControlPlane) -> Iterator[str]:
    if plane.request(f"/api/v1/namespaces/{NS}")[0] == 404:
        plane.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    secret = json.loads(issuer_secret(ISSUER, NS))
    plane.call("POST", f"/api/v1/namespaces/{NS}/secrets", secret)
    manifest = fleet.install_chart(
        plane, "nats.auth.mode=callout", f"nats.auth.callout.issuerSecret={ISSUER}"
    )
    try:
        yield manifest
    finally:
        fleet.helm(plane, "uninstall", fleet.RELEASE, "--namespace", NS)
        plane.request(f"/api/v1/namespaces/{NS}/secrets/{ISSUER}", method="DELETE")


def test_every_object_of_callout_mode_is_accepted(plane: ControlPlane, installed: str) -> None:
    found = fleet.kubectl(plane, "get", "-f", "-", "-o", "json", stdin=installed)
    assert found.returncode == 0, found.stderr
    names = {(i["kind"], i["metadata"]["name"]) for i in json.loads(found.stdout)["items"]}
    assert ("Deployment", "gpuop-nats-auth") in names
    assert ("ServiceAccount", "gpuop-driver-manager") in names


def test_the_callout_may_review_tokens_and_read_its_pods_and_nothing_no_account_may(
    plane: ControlPlane, installed: str
) -> None:
    assert fleet.allowed(plane, "nats-auth", "create", "tokenreviews.authentication.k8s.io")
    assert fleet.allowed(plane, "nats-auth", "get", "pods", NS)
    assert not fleet.allowed(plane, "nats-auth", "get", "pods", "ml-serving")
    wrong = [row for row in NEVER if fleet.allowed(plane, "nats-auth", *row)]
    assert not wrong


def deployment_env(plane: ControlPlane, name: str) -> dict[str, Any]:
    deployment = plane.call("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


async def test_the_callout_admits_a_pod_bound_token_as_its_nodes_agent(
    plane: ControlPlane, installed: str, tmp_path: Path
) -> None:
    node = sorted(n["metadata"]["name"] for n in plane.call("GET", "/api/v1/nodes")["items"])[0]
    account = fleet.service_account("driver-manager")
    pod = plane.call(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        {
            "metadata": {"name": f"driver-manager-{node}"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": account,
                "automountServiceAccountToken": False,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "agent", "image": "gpuop:test"}],
            },
        },
    )
    try:
        bound = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"]}
        bound["uid"] = pod["metadata"]["uid"]
        request = {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600}}
        request["spec"]["boundObjectRef"] = bound
        answer = plane.call(
            "POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token", request
        )
        token = answer["status"]["token"]

        # the callout, as its own ServiceAccount, with the account table the chart gave it
        kubeconfig = fleet.service_account_kubeconfig(plane, "nats-auth", tmp_path / "kc")
        variables = deployment_env(plane, "gpuop-nats-auth")
        accounts = callouts.Accounts.parse(variables["GPUOP_NATS_AUTH_ACCOUNTS"].split(","))
        issuer = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
        async with await kubeclient.connect(kubeconfig) as kube:
            reviewer = KubeTokenReviewer(kube, timeout=5.0)
            authorizer = callouts.Authorizer(issuer, reviewer, accounts, review_timeout=5.0)
            decision = await authorizer.authorize(
                authorization_request(token, issuer=issuer.public_key)[0]
            )
        assert decision.reason == "allowed", decision.detail
        assert decision.identity == grants.Identity("driver-manager", node)
    finally:
        plane.request(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}", method="DELETE")
