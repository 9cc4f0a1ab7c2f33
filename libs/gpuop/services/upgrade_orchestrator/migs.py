"""The MIG reconfiguration run by the orchestrator: its `SagaKind`, and what starts one.

`MIG_RECONFIGURATION` hands the runner the pure kind (`gpuop.saga.mig`): records under
`mig.<node>` in `gpuop_sagas`, the fold (`gpuop.saga.mig.folding`), its outputs. `Starter`
is its starting hook, given every event of the intake before the runner decides it, under
the node's lock:

- a `MigConfigRequested` naming a config on a node without a reconfiguration under way
  starts one: the plan is made here, once (`plans.plan`: the policy's mig-parted file, or
  the ConfigMap it names, read now, against the node's inventory from KV), stored
  (compare-and-set), recorded as `MigReconfigurationStarted` (which `gpuop replay` builds
  the same saga from, without the ConfigMap), and its first decision (`kind.begin`: fail
  at once, done at once, or `pending` and wait for admission) carried out. On a node with
  one under way the kind itself queues the request (`MigSaga.queued`);
- once the runner decided an event (`KindRunner.after`), a reconfiguration the decision
  ended with a request queued starts that one at once, under the request id the ended saga
  derives (`kind.next_request`); any later event of the node does the same, should a crash
  have come between the two;
- a leader that takes over records the start of a saga its predecessor stored and died
  before recording (`record_start`, called by the runner's resume).

A request whose label is removed (`config` None) starts nothing: the layout stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpuop.bus import KeyValue
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import Event, ids
from gpuop.events.mig import DOMAIN
from gpuop.events.mig_requests import MigConfigRequested
from gpuop.kube import client, errors
from gpuop.policy import GPUClusterPolicySpec, migconfig
from gpuop.policy.mig import parse_configs
from gpuop.saga.kinds import SagaKind
from gpuop.saga.mig import folding, kind, plans, records
from gpuop.saga.mig.records import MigSaga
from gpuop.saga.mig.states import TERMINAL_STATES
from gpuop.services.upgrade_orchestrator import kinds
from gpuop.services.upgrade_orchestrator.kinds import (
    KindRunner,
    StartRecorder,
    is_a_node,
)
from gpuop.services.upgrade_orchestrator.publishing import Publisher
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore

log = logging.getLogger(__name__)

KEY_PREFIX = folding.KEY_PREFIX


MIG_RECONFIGURATION: SagaKind[MigSaga] = folding.KIND
"""The MIG reconfiguration as the runtime runs it."""


class Starter:
    """Starts reconfigurations from the node label's requests (see the module docstring)."""

    def __init__(
        self,
        runner: Runner,
        store: SagaStore[MigSaga],
        inventories: KeyValue,
        *,
        kube: client.Kube | None = None,
        namespace: str = "default",
        clock: Clock = SYSTEM_CLOCK,
        known: Callable[[str], bool] = is_a_node,
    ) -> None:
        self._runner = runner
        self._known = known
        """Whether a node is one of the GPU nodes the orchestrator watches: a request about
        another starts nothing (the hostile-input e2e found requests about `_cluster`, which
        no Node can be labelled, stored as sagas and redelivered until dead-lettered)."""
        self._store = store
        self._inventories = inventories
        self._kube = kube
        self._namespace = namespace
        self._publish = Publisher(runner.bus, clock)
        self._recorder = StartRecorder(runner.bus, self._publish)

    def runner(self) -> KindRunner[MigSaga]:
        return KindRunner(
            MIG_RECONFIGURATION, self._store, self, self.record_start, self.start_queued
        )

    async def __call__(self, node: str, event: Event, now: datetime, cause: str | None) -> None:
        """Before the runner decides `event`: start the request it is, on a node without a
        reconfiguration under way (one under way queues it as it decides it)."""
        if not isinstance(event, MigConfigRequested) or event.config is None:
            await self.start_queued(node, event, now, cause)  # one a crash left unstarted
            return
        if not self._known(node):
            log.info("%s is not a GPU node the orchestrator watches: not re-carved", node)
            return
        existing = await self._store.get(node)
        if existing is None or existing.saga.state in TERMINAL_STATES:
            request = cause or ids.step(f"mig-label/{node}", event.config, 1)
            await self._start(node, event.config, request, now, cause)

    async def start_queued(self, node: str, event: Event, now: datetime, cause: str | None) -> None:
        """After the runner decided `event`: start the request queued behind the node's
        reconfiguration if the decision ended it."""
        existing = await self._store.get(node)
        if existing is None or existing.saga.state not in TERMINAL_STATES:
            return
        queued = kind.next_request(existing.saga)
        if queued is not None:
            await self._start(node, queued[0], queued[1], now, cause)

    async def record_start(self, saga: MigSaga) -> None:
        """Publish the `MigReconfigurationStarted` of a saga whose first leader stored it and
        died before recording it (a replay would have no saga to decide for): rebuilt from
        the record while it waits for its admission (its start time then still its step's),
        under the same id (a copy the log holds within the duplicate window is dropped)."""
        if saga.sequence:
            return
        await self._recorder.record(saga, folding.start_of(saga), saga.saga_id, saga.step_started)

    async def _start(
        self, node: str, config: str, request_id: str, now: datetime, cause: str | None
    ) -> None:
        policy = self._runner.policy()
        if policy is None:
            return
        file, source = await self._configs(policy)
        inventory = await kinds.inventory(self._inventories, node)
        plan = plans.plan(config, file, source, inventory)
        boot_id = inventory.boot_id if inventory is not None else None
        saga = records.new_saga(
            node=node, request_id=request_id, plan=plan, now=now, boot_id=boot_id
        )
        first = kind.begin(saga, policy, now)
        started = folding.start_of(saga)
        if not await kinds.store_new(self._store, self._publish, first.saga, started, now, cause):
            return
        log.info("re-carving %s to %s", node, config, extra={"node": node})
        await self._runner.act(self.runner(), first)

    async def _configs(
        self, policy: GPUClusterPolicySpec
    ) -> tuple[migconfig.MigConfigFile | None, str]:
        """The policy's mig-parted file, parsed, with where it came from; None (and why,
        in the source) when there is none or it cannot be read or parsed."""
        mig = policy.mig
        source = mig.configs_source
        text = mig.config
        if mig.config_map is not None:
            try:
                text = await self._config_map_text(mig.config_map, mig.config_map_key)
            except (errors.KubeError, KeyError, TypeError) as error:
                return None, f"{source}: cannot be read: {error}"
        if text is None:
            return None, source
        try:
            return parse_configs(text, source), source
        except ValueError as error:
            return None, str(error)

    async def _config_map_text(self, name: str, key: str) -> str:
        if self._kube is None:
            raise errors.KubeError("no Kubernetes API to read it from")
        kube = self._kube
        found: Any = await kube.call(kube.core.read_namespaced_config_map, name, self._namespace)
        return str(found["data"][key])


__all__ = ["DOMAIN", "MIG_RECONFIGURATION", "Starter"]
