"""Callout mode end to end with every part real: nats-server running deploy/nats/callout.conf,
`gpuop nats-auth` as its own process, reviewing tokens with the real kube-apiserver. A
driver-manager connects with a token its ServiceAccount got for a pod on a KWOK node and
publishes that node's driver events; another node's are refused; a token for the API
server's audience does not get in; the callout's /metrics counts both."""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from gpuop.bus import grants
from tests.support.callout_nats import CalloutNats
from tests.support.control_plane import ControlPlane
from tests.support.processes import free_port
from tests.support.service_account_tokens import agent_pod, token_for
from tests.support.shipped_nats import Refusals
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_cluster, pytest.mark.nats, pytest.mark.security]

ACCOUNT = "gpuop-driver-manager"


@pytest.fixture
def namespace(plane: ControlPlane) -> Iterator[str]:
    name = f"nats-callout-{uuid.uuid4().hex[:6]}"
    plane.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    plane.call(
        "POST", f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": ACCOUNT}}
    )
    try:
        yield name
    finally:
        plane.request(f"/api/v1/namespaces/{name}", method="DELETE")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[CalloutNats]:
    callout = CalloutNats(tmp_path / "nats")
    await callout.start()  # the server only: the callout is the process below
    try:
        yield callout
    finally:
        await callout.stop()


@pytest.fixture
async def callout_process(
    plane: ControlPlane, server: CalloutNats, namespace: str, tmp_path: Path
) -> AsyncIterator[int]:
    """`gpuop nats-auth` for `server`, as the chart runs it; the port of its /metrics."""
    seed = tmp_path / "seed"
    seed.write_text(server.issuer.seed)
    port = free_port()
    environment = {
        **os.environ,
        "GPUOP_NATS": f"tls://nats-auth:{server.passwords['nats-auth']}@localhost:{server.port}",
        "SSL_CERT_FILE": str(server.ca_file),
        "GPUOP_NATS_AUTH_ISSUER_SEED_FILE": str(seed),
        "GPUOP_NATS_AUTH_ACCOUNTS": f"{namespace}/{ACCOUNT}=driver-manager",
        "GPUOP_KUBECONFIG": str(plane.write_kubeconfig(tmp_path / "admin.kubeconfig")),
        "GPUOP_METRICS_LISTEN": f"127.0.0.1:{port}",
        "GPUOP_LOG_FORMAT": "text",
    }
    log = (tmp_path / "nats-auth.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuop.cli.main", "nats-auth", env=environment, stdout=log, stderr=log
    )
    try:
        await eventually(lambda: ready(port), timeout=30)
        yield port
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)
        log.close()
        assert process.returncode == 0, (tmp_path / "nats-auth.log").read_text()


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


def decisions(port: int, reason: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
        text = answer.read().decode()
    line = f'gpuop_nats_auth_decisions_total{{reason="{reason}"}} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


async def test_a_node_agent_gets_in_with_its_pod_token_for_its_node_only(
    plane: ControlPlane, server: CalloutNats, namespace: str, callout_process: int
) -> None:
    node = sorted(n["metadata"]["name"] for n in plane.call("GET", "/api/v1/nodes")["items"])[0]
    pod = agent_pod(plane, namespace, node)
    identity = grants.Identity("driver-manager", node)
    refusals = Refusals()
    refusals.nc = await nats.connect(
        server.url,
        tls=server.tls(),
        token=token_for(plane, namespace, pod=pod),
        inbox_prefix=grants.inbox_prefix(identity),
        error_cb=refusals.record,
        allow_reconnect=False,
        connect_timeout=5,
    )
    try:
        admin = await server.password_client("admin")
        try:  # the streams, as the orchestrator makes them
            await admin.jetstream().add_stream(name="GPUOP_EVENTS", subjects=["gpuop.evt.>"])
        finally:
            await admin.close()
        token = grants.Identity("driver-manager", node).node_token
        ack = await refusals.nc.jetstream().publish(f"gpuop.evt.driver.{token}.loaded", b"{}")
        assert ack.stream == "GPUOP_EVENTS"
        await refusals.nc.publish("gpuop.evt.driver.other-node.loaded", b"forged")
        await refusals.settle()
        assert refusals.refused_publish("gpuop.evt.driver.other-node.loaded")
    finally:
        await refusals.nc.close()
    assert decisions(callout_process, "allowed") == 1

    api_token = token_for(
        plane, namespace, pod=pod, audience="https://kubernetes.default.svc.cluster.local"
    )
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await nats.connect(
            server.url, tls=server.tls(), token=api_token, allow_reconnect=False, connect_timeout=5
        )
    assert decisions(callout_process, "wrong-audience") == 1
