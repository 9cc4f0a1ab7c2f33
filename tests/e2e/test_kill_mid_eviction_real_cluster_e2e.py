"""The orchestrator's leader SIGKILLed in the middle of an eviction, on the real control plane,
on purpose: the new leader finishes the eviction its predecessor left counted, without waiting
out the disruption controller, without counting it twice, and without evicting past a budget.

The eviction subresource (kube-apiserver's `pkg/registry/core/pod/storage/eviction.go`) first
counts the eviction in the budget's status (its own write of `poddisruptionbudgets/status`,
as `system:apiserver`: `disruptionsAllowed` down by one, the pod in `disruptedPods`), then
deletes the pod with the request's context. A validating webhook served here (`EvictionHold`)
holds that status write of the rollout's first eviction under a budget; while it is held the
leader's eviction request is in flight, and the test SIGKILLs the leader. Released, the write
goes through and the delete fails with the dead client's cancelled context: the budget counts
the eviction, the pod stays, and every eviction under that budget is refused (429) until the
disruption controller drops the entry, two minutes later. The test checks that state, then
starts a new replica, which leads once the dead leader's Lease expires. Its pod-deletion and
drain deadlines (60 s) are shorter than those two minutes: a new leader that evicted again
would fail the node with the budget named, so every node ending upgrade-done with no failure
on its path shows it did not wait.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes.aio import client as k8s

from gpuop.bus import NatsServer
from gpuop.events.upgrade import UpgradeState
from gpuop.kube import client
from tests.support import fleet, invariants
from tests.support.control_plane import ControlPlane
from tests.support.processes import free_port
from tests.support.rollouts import ROLLOUT_TIMEOUT, every_node_done, log_of, upgrade_policy
from tests.support.stack import stack
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.real_cluster]

S = UpgradeState
ORCHESTRATOR = f"system:serviceaccount:{fleet.RELEASE_NAMESPACE}:gpuop-upgrade-orchestrator"
WEBHOOK = "gpuop-test-hold-eviction"


class EvictionHold:
    """A validating webhook on `policy/v1` `poddisruptionbudgets/status` updates: it allows
    every write at once, but holds the first one the apiserver makes for an eviction (a pod
    name added to `disruptedPods`) until `release` is set. It keeps every status it saw."""

    def __init__(self, plane: ControlPlane, work: Path) -> None:
        self.plane, self.work = plane, work
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.pod: tuple[str, str] | None = None
        """The held eviction's pod: namespace and name."""
        self.budget: str | None = None
        self.statuses: list[dict[str, Any]] = []
        self.held_at = 0
        """How many statuses it had seen when it held one."""

    async def review(self, request: web.Request) -> web.Response:
        asked = (await request.json())["request"]
        new = (asked.get("object") or {}).get("status") or {}
        old = (asked.get("oldObject") or {}).get("status") or {}
        self.statuses.append(new)
        added = set(new.get("disruptedPods") or {}) - set(old.get("disruptedPods") or {})
        by_eviction = asked["userInfo"]["username"] == "system:apiserver"
        if added and by_eviction and not self.held.is_set():
            self.pod = (asked["namespace"], sorted(added)[0])
            self.budget = asked["name"]
            self.held_at = len(self.statuses)
            self.held.set()
            await self.release.wait()
        answer = {"uid": asked["uid"], "allowed": True}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        )

    @contextlib.asynccontextmanager
    async def serving(self, kube: client.Kube) -> AsyncIterator[EvictionHold]:
        certificate, key = self.plane.pki.authority().sign("eviction-hold", hosts=("127.0.0.1",))
        (self.work / "hold.crt").write_bytes(certificate)
        (self.work / "hold.key").write_bytes(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.work / "hold.crt", self.work / "hold.key")
        app = web.Application()
        app.router.add_post("/", self.review)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
        admission = k8s.AdmissionregistrationV1Api(kube.api_client)
        await admission.create_validating_webhook_configuration(self._configuration(port))
        try:
            yield self
        finally:
            self.release.set()
            await admission.delete_validating_webhook_configuration(WEBHOOK)
            await runner.cleanup()

    def _configuration(self, port: int) -> dict[str, Any]:
        rule = {
            "apiGroups": ["policy"],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["poddisruptionbudgets/status"],
        }
        ca = base64.b64encode(self.plane.pki.ca.read_bytes()).decode("ascii")
        hook = {
            "name": "hold.eviction.gpuop.test",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/", "caBundle": ca},
            "rules": [rule],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 30,
        }
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK},
            "webhooks": [hook],
        }


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path / "control-plane") as running:
        yield running


def pod_requests(plane: ControlPlane, user: str, name: str) -> Counter[tuple[str, str, int]]:
    """The audit log's requests of `user` on pod `name`: (verb, subresource, status code)."""
    found: Counter[tuple[str, str, int]] = Counter()
    for event in plane.audit_events():
        ref = event.get("objectRef") or {}
        ours = event["user"]["username"] == user and ref.get("resource") == "pods"
        if ours and ref.get("name") == name:
            code = (event.get("responseStatus") or {}).get("code", 0)
            found[(event["verb"], ref.get("subresource", ""), code)] += 1
    return found


@pytest.mark.timeout(600)
async def test_a_new_leader_finishes_the_eviction_its_killed_predecessor_left_counted(
    nats_server: NatsServer, tmp_path: Path, plane: ControlPlane
) -> None:
    async with (
        await client.connect(plane.write_kubeconfig(tmp_path / "admin.kubeconfig")) as admin,
        EvictionHold(plane, tmp_path).serving(admin) as hold,
        stack(tmp_path, nats_server.url, nodes_count=3, gpus=2, seed=40, plane=plane) as running,
    ):
        first = await running.start_replica()
        policy = upgrade_policy(max_parallel=1)
        await running.start_rollout(policy)
        await asyncio.wait_for(hold.held.wait(), ROLLOUT_TIMEOUT)
        assert hold.pod is not None and hold.budget is not None
        namespace, name = hold.pod
        killed = running.replicas[first]
        running.kill_replica(first)  # its eviction request is in the apiserver, held
        await killed.wait()  # gone, and its connections with it
        hold.release.set()

        async def counted() -> dict[str, Any] | None:
            found = await admin.call(
                admin.policy.read_namespaced_pod_disruption_budget, hold.budget, namespace
            )
            return found if name in (found.get("status") or {}).get("disruptedPods", {}) else None

        budget = await eventually(counted, 30, interval=0.2)
        pod = await admin.call(admin.core.read_namespaced_pod, name, namespace)
        # the state a kill mid-eviction leaves: counted, and the pod neither gone nor going
        assert pod["metadata"].get("deletionTimestamp") is None, pod["metadata"]
        assert budget["status"]["disruptionsAllowed"] == 0, budget["status"]

        await running.start_replica()  # leads once the killed leader's Lease expires
        await running.wait_until(
            "every node upgrade-done", lambda: every_node_done(running), ROLLOUT_TIMEOUT
        )
        lines = await running.export()

    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, 1)
    assert not walk.violations, "\n".join(walk.violations)
    for node in running.node_names:
        path = invariants.states(walk, node)
        # a new leader that evicted the pod again would be refused until its deadline
        assert path[-1] is S.UPGRADE_DONE and S.UPGRADE_FAILED not in path, (node, path)
    requests = pod_requests(plane, ORCHESTRATOR, name)
    # counted once (the killed leader's eviction), then deleted, never evicted a second time
    assert not [key for key in requests if key[:2] == ("create", "eviction") and key[2] < 300]
    assert requests[("delete", "", 200)] == 1, requests
    # from the first eviction on (the workloads were starting before), no budget allowed less
    # than nothing, nor had fewer healthy pods than it needs
    for status in hold.statuses[hold.held_at :]:
        assert status.get("disruptionsAllowed", 0) >= 0, status
        assert status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0), status
    assert running.unclean_exits() == {}
