"""The bundled cluster's NATS configuration, as the chart renders it with
ci/nats-cluster-values.yaml and the password users (nats.auth.mode=static; callout mode's
cluster is test_nats_callout_cluster), in three real nats-servers on loopback: they route to
each other over TLS, elect a JetStream meta leader, and keep a stream on all three.

As in shipped_nats, only what cannot be the same on a test machine is rewritten, each line
checked to exist exactly once: the addresses (127.0.0.1, a route port per server), the stores,
the TLS files (a throwaway CA, the certificate for localhost) and, in routes.conf, the servers'
DNS names (localhost with each server's route port). POD_NAME and the passwords come from the
environment as in the chart's pods.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
from pathlib import Path

import nats
import pytest

from gpuop.bus import launcher
from gpuop.bus.errors import BusUnavailable
from tests.support.charts import NAMESPACE, render_with, values
from tests.support.nats_cluster_files import cluster_files, formed, free_ports
from tests.support.shipped_nats import (
    shipped_users,
    write_certificate,
)

pytestmark = pytest.mark.nats


async def test_the_rendered_cluster_routes_over_tls_elects_a_meta_leader_and_keeps_r3(
    tmp_path: Path,
) -> None:
    overrides = values("nats-cluster") or {}
    overrides["nats"]["auth"] = {"mode": "static"}
    rendering = render_with(overrides)
    files = rendering.get("ConfigMap", "gpuop-nats-config")["data"]
    statefulset = rendering.get("StatefulSet", "gpuop-nats")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    entry = Path(container["args"][-1]).name
    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    pods = [f"{name}-{ordinal}" for ordinal in range(statefulset["spec"]["replicas"])]
    route_ports = free_ports(len(pods))
    routes = {
        f"{pod}.{service}.{NAMESPACE}.svc.cluster.local:6222": f"localhost:{port}"
        for pod, port in zip(pods, route_ports, strict=True)
    }
    write_certificate(tmp_path)
    users = shipped_users()
    passwords = {user.name: "p" + secrets.token_hex(16) for user in users.values()}
    env = {users[user].password_variable: password for user, password in passwords.items()}

    processes: list[asyncio.subprocess.Process] = []
    monitors: dict[str, str] = {}
    clients: list[str] = []
    try:
        for pod, port in zip(pods, route_ports, strict=True):
            workdir = tmp_path / pod
            (workdir / "ports").mkdir(parents=True)
            for file, text in cluster_files(files, workdir, tmp_path, port, routes).items():
                (workdir / file).write_text(text, encoding="utf-8")
            log = workdir / "nats-server.log"
            try:
                process, listening = await launcher.run_server(
                    workdir / entry, workdir / "ports", env={**env, "POD_NAME": pod}, log=log
                )
            except BusUnavailable as error:
                raise AssertionError(f"{pod}: {error}\n{log.read_text()}") from None
            processes.append(process)
            monitors[pod] = listening["monitoring"][0]
            clients.append(f"localhost:{listening['nats'][0].rsplit(':', 1)[1]}")

        jsz = await formed(monitors)
        assert {info["meta_cluster"]["name"] for info in jsz.values()} == {"gpuop"}

        # every server has each stream: the cluster's point, and what GPUOP_NATS_REPLICAS=3 asks
        nc = await nats.connect(
            [f"tls://admin:{passwords['admin']}@{address}" for address in clients],
            tls=ssl.create_default_context(cafile=str(tmp_path / "ca.crt")),
            name="test-cluster-admin",
            allow_reconnect=False,
            connect_timeout=5,
        )
        try:
            js = nc.jetstream(timeout=10.0)
            await js.add_stream(name="TEST_R3", subjects=["test.r3"], num_replicas=3)
            ack = await _publish_once_led(js, "test.r3", b"kept three times")
            info = await js.stream_info("TEST_R3")
        finally:
            await nc.close()
        assert ack.stream == "TEST_R3"
        assert info.cluster is not None
        placed = {info.cluster.leader} | {peer.name for peer in info.cluster.replicas or []}
        assert placed == set(pods)
    finally:
        for process in processes:
            await launcher.terminate(process)


async def _publish_once_led(
    js: nats.js.JetStreamContext, subject: str, payload: bytes
) -> nats.js.api.PubAck:
    """Publish once the new stream answers: an R3 stream's group elects its leader after the
    create returns, and until then (or until the subject's interest reaches the server this
    client is on) a publish has no responders. Seen on a loaded two-core CI machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        try:
            return await js.publish(subject, payload)
        except nats.js.errors.NoStreamResponseError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)
