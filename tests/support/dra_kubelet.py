"""The kubelet's side of a DRA kubelet plugin, for tests: a gRPC client written from the
kubelet's protos that registers the plugin the way the kubelet does (GetInfo on the socket
in `plugins_registry`, NotifyRegistrationStatus), then calls NodePrepareResources,
NodeUnprepareResources and NodeWatchResources at the endpoint the plugin named. Also the
allocation facts the device plugin's cluster role would publish for a node."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from gpuop.events import dra
from gpuop.kubelet.dra.v1 import api_pb2 as v1
from gpuop.kubelet.dra.v1 import api_pb2_grpc as v1_grpc
from gpuop.kubelet.dra.v1beta1 import api_pb2 as v1beta1
from gpuop.kubelet.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpuop.kubelet.dra_health.v1 import api_pb2 as health
from gpuop.kubelet.dra_health.v1 import api_pb2_grpc as health_grpc
from gpuop.kubelet.pluginregistration.v1 import api_pb2 as registration
from gpuop.kubelet.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from gpuop.kubelet.sockets import UnixTarget

KUBELET_DIR = "var/lib/kubelet"
"""The kubelet's root directory, relative to the host root, unless a test says otherwise."""
NAMESPACE = "ml"


def claim_uid(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


def allocated(
    n: int,
    gpu_uuids: Sequence[str],
    *,
    node: str,
    version: int = 10,
    configs: Sequence[dict[str, Any]] = (),
    devices: Sequence[str] | None = None,
    mig_uuids: Sequence[str | None] | None = None,
) -> dra.ClaimAllocated:
    """Claim `n`'s allocation of `gpu_uuids` on `node`, as the cluster role publishes it;
    `devices` names them (default `gpu-<i>`), `configs` are claim configurations."""
    names = devices or [f"gpu-{i}" for i in range(len(gpu_uuids))]
    migs = mig_uuids or [None] * len(gpu_uuids)
    return dra.ClaimAllocated(
        claim=dra.ClaimRef(namespace=NAMESPACE, name=f"claim-{n}", uid=claim_uid(n)),
        devices=tuple(
            dra.AllocatedDevice(
                request="gpu",
                driver=dra.DRIVER,
                pool=node,
                device=name,
                gpu_uuid=uuid,
                mig_uuid=mig,
            )
            for name, uuid, mig in zip(names, gpu_uuids, migs, strict=True)
        ),
        configs=tuple(
            dra.OpaqueConfig(source=dra.ConfigSource.CLAIM, parameters=c) for c in configs
        ),
        resource_version=str(version),
    )


def released(n: int) -> dra.ClaimReleased:
    return dra.ClaimReleased(
        claim=dra.ClaimRef(namespace=NAMESPACE, name=f"claim-{n}", uid=claim_uid(n)),
        deleted=True,
    )


def claim(n: int) -> v1.Claim:
    return v1.Claim(namespace=NAMESPACE, name=f"claim-{n}", uid=claim_uid(n))


class FakeKubelet:
    """What the kubelet does with a DRA plugin, under one host root."""

    def __init__(self, host_root: Path, kubelet_dir: str = KUBELET_DIR) -> None:
        self.host_root = host_root
        self.registry = host_root / kubelet_dir / "plugins_registry"
        """Where this kubelet watches for registration sockets."""
        self.info: registration.PluginInfo | None = None
        self._channel: grpc.aio.Channel | None = None
        self._targets: list[UnixTarget] = []

    async def register(self, driver: str = dra.DRIVER, *, accept: bool = True) -> None:
        """GetInfo on the plugin's registration socket, then tell it the outcome."""
        socket = self.registry / f"{driver}-reg.sock"
        target = UnixTarget(socket)
        self._targets.append(target)
        async with grpc.aio.insecure_channel(target.address) as channel:
            stub = registration_grpc.RegistrationStub(channel)
            self.info = await stub.GetInfo(registration.InfoRequest(), timeout=5)
            error = "" if accept else "refused by the test"
            await stub.NotifyRegistrationStatus(
                registration.RegistrationStatus(plugin_registered=accept, error=error),
                timeout=5,
            )

    def _plugin_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            assert self.info is not None, "register first"
            endpoint = Path(self.info.endpoint)
            target = UnixTarget(self.host_root / endpoint.relative_to("/"))
            self._targets.append(target)
            self._channel = grpc.aio.insecure_channel(target.address)
        return self._channel

    async def prepare(self, *claims: v1.Claim) -> v1.NodePrepareResourcesResponse:
        stub = v1_grpc.DRAPluginStub(self._plugin_channel())
        request = v1.NodePrepareResourcesRequest(claims=claims)
        response: v1.NodePrepareResourcesResponse = await stub.NodePrepareResources(
            request, timeout=10
        )
        return response

    async def prepare_v1beta1(self, *claims: v1.Claim) -> v1beta1.NodePrepareResourcesResponse:
        stub = v1beta1_grpc.DRAPluginStub(self._plugin_channel())
        request = v1beta1.NodePrepareResourcesRequest(
            claims=[v1beta1.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]
        )
        response: v1beta1.NodePrepareResourcesResponse = await stub.NodePrepareResources(
            request, timeout=10
        )
        return response

    async def unprepare(self, *claims: v1.Claim) -> v1.NodeUnprepareResourcesResponse:
        stub = v1_grpc.DRAPluginStub(self._plugin_channel())
        request = v1.NodeUnprepareResourcesRequest(claims=claims)
        response: v1.NodeUnprepareResourcesResponse = await stub.NodeUnprepareResources(
            request, timeout=10
        )
        return response

    @asynccontextmanager
    async def health(self) -> AsyncIterator[AsyncIterator[health.NodeWatchResourcesResponse]]:
        """The plugin's health stream, cancelled on the way out."""
        stub = health_grpc.DRAResourceHealthStub(self._plugin_channel())
        call = stub.NodeWatchResources(health.NodeWatchResourcesRequest())
        try:
            yield call.__aiter__()
        finally:
            call.cancel()

    async def close(self) -> None:
        """Drop the connection, as the kubelet does when the plugin's socket goes."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        for target in self._targets:
            target.close()
        self._targets.clear()
