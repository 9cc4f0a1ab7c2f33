"""Every message id gpuop derives, one function per kind: the same facts always give the same
id, so a message published twice (a retry, a crash, a new leader re-issuing a step) is stored
once (the id is the `Nats-Msg-Id`) and answered once (agents keep outcomes by id).

Each id is a name-based UUID (version 5, one namespace) of `<owner>/<token>/<attempt>`.
Owners never contain a `/` but saga ids, which contain exactly one (`<rollout>/<node>`);
tokens never contain one; the kinds sharing an owner have tokens no other kind can spell.
So two kinds never meet on one id (`tests/unit/test_events_ids.py` tries hard):

    kind           function                          owner     token                   attempt
    step           step(saga, token, attempt)        saga      the step's token        saga's
                                                               (`cordon`, `unload-gpu-2`)
    label          label(saga, sequence, attempt)    saga      `label-<sequence>`      saga's
    kube event     kube_event(saga, seq, attempt)    saga      `event-<sequence>`      saga's
    transition     transition(saga, sequence)        saga      `transition-<sequence>` 1
    started        started(saga)                     saga      `started`               1
    admitted       admitted(saga, attempt)           saga      `admitted`              saga's
    deadline       deadline(saga, state, step, att)  saga      `deadline-<state>-<step>` saga's
    pods observed  pods_observed(saga, counts, att)  saga      `pods-<jobs>-<gpu>-<drainable>`
    node observed  node_observed(uid, version)       Node uid  `observed-<resourceVersion>` 1
    node removed   node_removed(uid)                 Node uid  `removed`               1
    rollout event  rollout_event(rollout, what)      rollout   `started`, `completed`, `failed`,
                                                               `superseded-by-<rollout>`  1
    outcome        outcome(action)                   action id `outcome`               1
    result         result(command)                   command id `result`               1
"""

from __future__ import annotations

import functools
import uuid

_NAMESPACE = uuid.UUID("6b1d6d0e-4a57-4c1e-9f3e-8c3c1f1f0a11")


@functools.lru_cache(maxsize=16384)
def _derive(owner: str, token: str, attempt: int) -> str:
    return uuid.uuid5(_NAMESPACE, f"{owner}/{token}/{attempt}").hex


def step(saga_id: str, token: str, attempt: int) -> str:
    """The command or Kubernetes action a saga step issues (`Step.token`)."""
    return _derive(saga_id, token, attempt)


def label(saga_id: str, sequence: int, attempt: int) -> str:
    """The state-label write of the saga's `sequence`-th transition."""
    return _derive(saga_id, f"label-{sequence}", attempt)


def kube_event(saga_id: str, sequence: int, attempt: int) -> str:
    """The Kubernetes Event of the saga's `sequence`-th transition."""
    return _derive(saga_id, f"event-{sequence}", attempt)


def transition(saga_id: str, sequence: int) -> str:
    """The `NodeUpgradeStateChanged` of the saga's `sequence`-th transition."""
    return _derive(saga_id, f"transition-{sequence}", 1)


def started(saga_id: str) -> str:
    """The saga's `SagaStarted`."""
    return _derive(saga_id, "started", 1)


def refused(cause: str) -> str:
    """The `RemediationRefused` of the health event `cause`: one per event, however often
    it is redelivered."""
    return _derive(cause, "remediation-refused", 1)


def admitted(saga_id: str, attempt: int) -> str:
    """The `NodeAdmitted` of the saga's `attempt`."""
    return _derive(saga_id, "admitted", attempt)


def deadline(saga_id: str, state: str, step_token: str, attempt: int) -> str:
    """The `DeadlineExpired` of a step's deadline, whoever publishes it."""
    return _derive(saga_id, f"deadline-{state}-{step_token}", attempt)


def pods_observed(saga_id: str, counts: tuple[int, int, int], attempt: int) -> str:
    """A `PodsObserved` of (job, GPU, drainable) pod counts: one per distinct count."""
    jobs, gpu, drainable = counts
    return _derive(saga_id, f"pods-{jobs}-{gpu}-{drainable}", attempt)


def node_observed(node_uid: str, resource_version: str) -> str:
    """A `NodeObserved` of one version of a Node object."""
    return _derive(node_uid, f"observed-{resource_version}", 1)


def node_removed(node_uid: str) -> str:
    """The `NodeRemoved` of a Node object."""
    return _derive(node_uid, "removed", 1)


def rollout_event(rollout_id: str, what: str) -> str:
    """A rollout's `started`, `completed`, `failed` or `superseded-by-<rollout>` event."""
    return _derive(rollout_id, what, 1)


def outcome(action_id: str) -> str:
    """The event reporting how a Kubernetes action ended: one per action."""
    return _derive(action_id, "outcome", 1)


def result(command_id: str) -> str:
    """The driver-manager's answer to a command: the same every time it is answered."""
    return _derive(command_id, "result", 1)
