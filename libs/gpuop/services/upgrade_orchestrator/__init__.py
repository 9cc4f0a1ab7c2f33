"""upgrade-orchestrator: rolling driver upgrades as durable per-node sagas, leader-elected
with a Lease.

The cluster role. How it flows, module by module:

    leading     the Lease; while leader (and holding the presence), runs the controller
    presence    the leader's short lease in KV: a standby fences a dead leader off in seconds
    controller  watches the policy and the nodes, starts sagas, admits, reports
    policies    the GPUClusterPolicy: validated spec, status conditions and counts
    observing   node watch -> kube.NodeObserved / NodeRemoved events
    jobs        pods of nodes waiting for jobs -> kube.PodsObserved events
    nodepods    one informer of a node's pods, shared by wait-for-jobs, pod deletion, drain
    intake      the one durable consumer of what the decision core needs
    running     event -> folding.step -> compare-and-set -> outbox; resume after a crash
    kinds       the saga kinds beside the upgrade (remediation, MIG): store, fold, outputs
    remediations  the GPU remediation kind and what starts one (a GPU's health, the breaker)
    migs        the MIG reconfiguration kind and what starts one (the node's mig.config label)
    store       the sagas in KV `gpuop_sagas`
    acting      the outbox: commands, Kubernetes actions, public state changes
    executing   Kubernetes actions through gpuop.kube, outcomes as events
    deadlines   expired deadlines published as events
    publishing  the one publisher: the orchestrator's source and clock on every message
    traces      one trace per saga attempt, under ids derived from the saga
    rollouts    rollout ids and the public rollout events
    config      the `--config` file
"""

from gpuop.kube import client
from gpuop.runtime.services import ServiceContext, ServiceDefinition
from gpuop.runtime.settings import Role
from gpuop.services.upgrade_orchestrator import config, leading


async def main(context: ServiceContext) -> None:
    """Campaign for the Lease and lead rollouts until the service stops."""
    settings = config.load_config(context.settings.config)
    kube = await client.connect(context.settings.kubeconfig)
    try:
        context.ready, context.not_ready_reason = True, ""
        await leading.lead(context.bus, kube, settings, context.stopping)
    finally:
        await kube.close()


SERVICE = ServiceDefinition(
    name="upgrade-orchestrator",
    summary="rolling driver upgrades as durable per-node sagas",
    roles=frozenset({Role.CLUSTER}),
    main=main,
)
