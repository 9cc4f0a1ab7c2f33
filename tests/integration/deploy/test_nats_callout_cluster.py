"""Callout mode on the bundled cluster, as the chart renders it by default with
nats.cluster.enabled, in three real nats-servers: the issuer is the Ed25519 key Helm
generated, which the init container's command writes as each server's issuer include and the
callout reads as its key; a callout connected to one server answers the clients of every
server, each server checks the answer against that issuer, and a node agent admitted on
another server is still its node's only."""

from __future__ import annotations

import asyncio
import base64
import secrets
import ssl
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from gpuop.bus import callouts, grants, launcher, nkeys, reviewers
from gpuop.bus.errors import BusUnavailable
from gpuop.cli import main, natsauth
from tests.support.callout_nats import PASSWORD_USERS
from tests.support.charts import NAMESPACE, Rendering, render
from tests.support.nats_cluster_files import cluster_files, formed, free_ports
from tests.support.shipped_nats import Refusals, write_certificate

pytestmark = [pytest.mark.nats, pytest.mark.security]

ISSUER_SECRET = "gpuop-nats-issuer"


async def issuer_include(rendering: Rendering, tmp_path: Path) -> nkeys.KeyPair:
    """The generated key, and the include the NATS pods' init container writes from it at
    tmp_path/issuer/issuer.conf (what callout.conf's `include "../issuer/issuer.conf"` reads
    from each server's directory), made by the init container's own arguments."""
    pem = base64.b64decode(rendering.get("Secret", ISSUER_SECRET)["data"]["key.pem"]).decode()
    (tmp_path / "issuer-key").mkdir()
    (tmp_path / "issuer").mkdir()
    (tmp_path / "issuer-key" / "key.pem").write_text(pem)
    statefulset = rendering.get("StatefulSet", "gpuop-nats")
    (init,) = statefulset["spec"]["template"]["spec"]["initContainers"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    arguments = [
        argument.replace(mounts["issuer-key"], str(tmp_path / "issuer-key")).replace(
            mounts["issuer"], str(tmp_path / "issuer")
        )
        for argument in init["args"]
    ]
    # `gpuop` runs its own event loop: in a thread, as the init container runs it apart
    assert await asyncio.to_thread(main.main, arguments) == 0
    return nkeys.KeyPair.from_pem(pem, nkeys.Kind.ACCOUNT)


async def test_a_callout_on_one_server_admits_the_clients_of_every_server(
    tmp_path: Path,
) -> None:
    rendering = render("nats-cluster")
    files = rendering.get("ConfigMap", "gpuop-nats-config")["data"]
    statefulset = rendering.get("StatefulSet", "gpuop-nats")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    entry = Path(container["args"][-1]).name
    assert "NATS_AUTH_ISSUER" not in {e["name"] for e in container["env"]}
    callout = rendering.get("Deployment", "gpuop-nats-auth")
    (auth,) = callout["spec"]["template"]["spec"]["containers"]
    auth_env = {e["name"]: e.get("value") for e in auth["env"]}
    table = auth_env["GPUOP_NATS_AUTH_ACCOUNTS"]
    assert auth_env["GPUOP_NATS_AUTH_ISSUER_SEED_FILE"] == "/etc/gpuop/nats-auth/key.pem"

    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    pods = [f"{name}-{ordinal}" for ordinal in range(statefulset["spec"]["replicas"])]
    route_ports = free_ports(len(pods))
    routes = {
        f"{pod}.{service}.{NAMESPACE}.svc.cluster.local:6222": f"localhost:{port}"
        for pod, port in zip(pods, route_ports, strict=True)
    }
    write_certificate(tmp_path)
    issuer = await issuer_include(rendering, tmp_path)
    passwords = {user: "p" + secrets.token_hex(16) for user in PASSWORD_USERS}
    env = {variable: passwords[user] for user, variable in PASSWORD_USERS.items()}
    tls = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    processes: list[asyncio.subprocess.Process] = []
    monitors: dict[str, str] = {}
    clients: list[str] = []
    reviewer = reviewers.MemoryReviewer()
    stopping = asyncio.Event()
    serving: asyncio.Task[None] | None = None
    callout_nc = None
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
        await formed(monitors)

        # the callout on the first server, with the chart's account table
        callout_nc = await nats.connect(
            f"tls://nats-auth:{passwords['nats-auth']}@{clients[0]}",
            tls=tls,
            allow_reconnect=False,
            connect_timeout=5,
        )
        # the callout's key as its command reads the Secret's file: the servers' issuer
        key = natsauth.issuer_from(str(tmp_path / "issuer-key" / "key.pem"))
        assert key.public_key == issuer.public_key
        authorizer = callouts.Authorizer(
            key,
            reviewer,
            callouts.Accounts.parse(table.split(",")),
            metrics=callouts.CalloutMetrics(CollectorRegistry()),
        )
        serving = asyncio.create_task(callouts.serve(callout_nc, authorizer, stopping))
        await callout_nc.flush()

        # a driver-manager of gpu-1 on the last server: admitted, its node's only
        identity = grants.Identity("driver-manager", "gpu-1")
        token = reviewer.issue(
            f"system:serviceaccount:{NAMESPACE}:gpuop-driver-manager", node="gpu-1"
        )
        refusals = Refusals()
        refusals.nc = await connect_when_interest_has_spread(
            f"tls://{clients[-1]}", tls, token, grants.inbox_prefix(identity), refusals
        )
        try:
            await refusals.nc.publish("gpuop.evt.driver.gpu-1.loaded", b"its own")
            await refusals.nc.publish("gpuop.evt.driver.gpu-2.loaded", b"forged")
            await refusals.settle()
            assert refusals.refused_publish("gpuop.evt.driver.gpu-2.loaded")
            assert not refusals.refused_publish("gpuop.evt.driver.gpu-1.loaded")
        finally:
            await refusals.nc.close()
    finally:
        stopping.set()
        if serving is not None:
            await serving
        if callout_nc is not None:
            await callout_nc.close()
        for process in processes:
            await launcher.terminate(process)


async def connect_when_interest_has_spread(
    url: str, tls: ssl.SSLContext, token: str, inbox_prefix: str, refusals: Refusals
) -> Client:
    """The callout's subscription reaches the other servers over the routes a moment after it
    is made; until then their clients are refused as with no callout. Try until admitted."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        try:
            nc = await nats.connect(
                url,
                tls=tls,
                token=token,
                inbox_prefix=inbox_prefix,
                error_cb=refusals.record,
                allow_reconnect=False,
                connect_timeout=5,
            )
            if nc.is_connected:
                return nc
            await nc.close()
        except (nats.errors.Error, OSError):
            pass
        if loop.time() > deadline:
            raise AssertionError(f"not admitted through the callout within 15 s: {refusals.errors}")
        await asyncio.sleep(0.2)
