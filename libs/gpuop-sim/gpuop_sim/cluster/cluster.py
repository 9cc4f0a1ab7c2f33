"""``SimCluster``: the simulated API server with GPU nodes, their kubelets and workloads.

Tests, the demo and ``gpuop sim apiserver`` start a whole cluster with
``async with SimCluster(nodes=3, gpus=8) as cluster``: an :class:`~gpuop_sim.ApiServer`
(which serves ``apps/v1`` Deployments and ReplicaSets and ``batch/v1`` Jobs too), one
simulated kubelet per machine (``kubelet.py``), the scheduler (``scheduling.py``), the
workload controllers (``replication.py``, ``jobs.py``, ``daemons.py``) and, unless ``workloads`` is
false, the generated workloads (``workloads.py``). Clients reach it as any cluster,
through ``cluster.write_kubeconfig(path)``; tests drive machines with :meth:`reboot`,
:meth:`power_off` and :meth:`power_on`, and wait for quiet with :meth:`settle`.

Time: server timestamps come from ``clock``; waits are real but short (``start_delay``
before a pod runs, at most ``termination_cap`` for a pod to terminate), so a test of a
drain or a reboot takes a fraction of a second, while the defaults of the CLI make the
same steps visible to a person.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections import Counter
from pathlib import Path

from gpuop import lifecycles
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.accounting import RequestKind
from gpuop_sim.apiserver.faults import FaultPlan
from gpuop_sim.apiserver.pdb import is_healthy
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.server import ApiServer
from gpuop_sim.cluster import machines, workload_kinds, workloads
from gpuop_sim.cluster.daemons import DaemonSetController
from gpuop_sim.cluster.jobs import JobController
from gpuop_sim.cluster.kubelet import Kubelet
from gpuop_sim.cluster.machines import Machine
from gpuop_sim.cluster.replication import DeploymentController
from gpuop_sim.cluster.scheduling import Scheduler, gpus_requested, holds_resources

logger = logging.getLogger(__name__)


class SimCluster(lifecycles.Startable):
    """A Kubernetes cluster of ``nodes`` machines with ``gpus`` GPUs each, in process."""

    def __init__(
        self,
        nodes: int = 3,
        gpus: int = 8,
        *,
        workloads: bool = True,
        seed: int = 0,
        start_delay: float = 0.05,
        termination_cap: float = 0.1,
        heartbeat_interval: float = 10.0,
        job_seconds: float = 600.0,
        node_prefix: str = "gpu-node-",
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        bookmark_interval: float = 5.0,
        anonymous_auth: bool = False,
        faults: FaultPlan | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``start_delay``: seconds from admission to Running. ``termination_cap``: the
        most seconds a terminating pod lingers (its grace period, if shorter).
        ``job_seconds``: how long generated Job pods run. ``seed`` fixes machine ids,
        boot ids and pod names. ``anonymous_auth`` and ``faults``: see :class:`ApiServer`;
        faults reach only the server's clients, never the kubelets and controllers that
        work in process."""
        if nodes < 0 or gpus < 0:
            raise ValueError(f"nodes and gpus must not be negative (got {nodes}, {gpus})")
        self.server = ApiServer(
            host=host,
            port=port,
            token=token,
            kubelet_delay=None,
            bookmark_interval=bookmark_interval,
            anonymous_auth=anonymous_auth,
            faults=faults,
            clock=clock,
        )
        workload_kinds.register(self.server.catalog)
        self.gpus = gpus
        self.job_seconds = job_seconds
        self._workloads = workloads
        self._rng = random.Random(seed)
        kind = machines.machine_type(gpus)
        self.machines = [
            Machine.create(f"{node_prefix}{index}", index, kind, self._rng)
            for index in range(1, nodes + 1)
        ]
        self.kubelets = {
            machine.name: Kubelet(
                self.registry,
                machine,
                rng=self._rng,
                start_delay=start_delay,
                termination_cap=termination_cap,
                heartbeat_interval=heartbeat_interval,
            )
            for machine in self.machines
        }
        self.scheduler = Scheduler(self.registry)
        self.daemonsets = DaemonSetController(self.registry, self._rng)
        self.deployments = DeploymentController(self.registry, self._rng)
        self.jobs = JobController(self.registry, self._rng)
        self._returns: dict[str, tuple[asyncio.TimerHandle, asyncio.Future[None]]] = {}

    @property
    def registry(self) -> Registry:
        return self.server.registry

    @property
    def url(self) -> str:
        return self.server.url

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context trusting the API server (see :meth:`ApiServer.ssl_context`)."""
        return self.server.ssl_context()

    @property
    def faults(self) -> FaultPlan:
        """What the API server gets wrong on purpose; change it while the cluster runs."""
        return self.server.faults

    @property
    def requests(self) -> Counter[RequestKind]:
        """Requests the API server served, by verb, resource and scope (its clients' own:
        the simulated kubelets and controllers work in process)."""
        return self.server.requests

    @property
    def node_names(self) -> list[str]:
        return [machine.name for machine in self.machines]

    def write_kubeconfig(self, path: Path) -> Path:
        return self.server.write_kubeconfig(path)

    async def start(self) -> None:
        await self.server.start()
        for kubelet in self.kubelets.values():
            kubelet.power_on()
        if self._workloads:
            workloads.install(
                self.registry, self.node_names, self.gpus, job_seconds=self.job_seconds
            )

    async def stop(self) -> None:
        for timer, returned in self._returns.values():
            timer.cancel()
            returned.cancel()
        self._returns.clear()
        for kubelet in self.kubelets.values():
            kubelet.close()
        self.scheduler.close()
        self.daemonsets.close()
        self.deployments.close()
        self.jobs.close()
        await self.server.stop()

    # Machines.

    def machine(self, node: str) -> Machine:
        return self._kubelet(node).machine

    def boot_id(self, node: str) -> str:
        return self.machine(node).boot_id

    def is_up(self, node: str) -> bool:
        return self._kubelet(node).up

    def power_off(self, node: str) -> None:
        """Cut the machine's power: its kubelet stops and the node goes NotReady."""
        self._kubelet(node).power_off()

    def fail_diagnostics(
        self, node: str, exit_code: int = 1, log: str = "", *, image: str | None = None
    ) -> None:
        """Make gpuop's validation pods on `node` (of `image`, or every one) exit
        `exit_code` with `log` as their last log lines; 0 heals it."""
        self._kubelet(node).fail_diagnostics(exit_code, log, image=image)

    def power_on(self, node: str) -> None:
        """Boot the machine with a new boot id; its node turns Ready again."""
        self._kubelet(node).power_on()

    async def reboot(self, node: str, *, down_for: float) -> None:
        """Take the node down for ``down_for`` seconds, then boot it; returns once it is
        Ready again. The machine comes back even if the caller stops waiting."""
        kubelet = self._kubelet(node)
        if not kubelet.up or node in self._returns:
            raise RuntimeError(f"node {node} is already down")
        kubelet.power_off()
        loop = asyncio.get_running_loop()
        returned: asyncio.Future[None] = loop.create_future()

        def come_back() -> None:
            self._returns.pop(node, None)
            try:
                kubelet.power_on()
            except Exception as error:
                logger.exception("simulated node %s failed to boot", node)
                returned.set_exception(error)
                return
            returned.set_result(None)

        self._returns[node] = (loop.call_later(down_for, come_back), returned)
        await asyncio.shield(returned)

    # Observation.

    def gpus_in_use(self, node: str) -> int:
        """GPUs held on ``node`` by pods bound to it that have not finished."""
        return sum(
            gpus_requested(pod)
            for pod in self.registry.store.view(kinds.PODS.group_resource)
            if holds_resources(pod) and pod["spec"]["nodeName"] == node
        )

    def unsettled(self) -> list[str]:
        """What still changes on its own: machines down, pods not yet placed, started,
        ready or gone, workloads whose controllers have not caught up."""
        found = [f"node {name} is down" for name, k in self.kubelets.items() if not k.up]
        store = self.registry.store
        for pod in store.view(kinds.PODS.group_resource):
            metadata, status = pod["metadata"], pod.get("status") or {}
            key = f"pod {metadata['namespace']}/{metadata['name']}"
            unschedulable = any(
                c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in status.get("conditions") or []
            )
            if metadata.get("deletionTimestamp"):
                found.append(f"{key} is terminating")
            elif status.get("phase") not in ("Succeeded", "Failed") and not (
                is_healthy(pod) or unschedulable
            ):
                found.append(f"{key} is {status.get('phase', 'Pending')}, not ready")
        for resource in (workload_kinds.DEPLOYMENTS, workload_kinds.REPLICASETS, kinds.DAEMONSETS):
            for obj in store.view(resource.group_resource):
                observed = (obj.get("status") or {}).get("observedGeneration")
                if observed != obj["metadata"].get("generation", 1):
                    found.append(f"{resource.kind} {obj['metadata']['name']} is not observed")
        return found

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until :meth:`unsettled` is empty; TimeoutError says what is not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while found := self.unsettled():
            if loop.time() >= deadline:
                raise TimeoutError(f"the simulated cluster did not settle: {found[:5]}")
            await asyncio.sleep(0.01)

    def _kubelet(self, node: str) -> Kubelet:
        try:
            return self.kubelets[node]
        except KeyError:
            raise KeyError(f"no simulated machine {node!r}") from None
