"""How long each upgrade step may take, and how long a failed node waits before a retry.

Upstream lets some waits run forever (`timeoutSeconds: 0`, and steps such as the driver
reload have no timeout at all), so one stuck node can hold a rollout indefinitely. In gpuop
every wait of the saga has a deadline from `Deadlines`: the orchestrator schedules it when
the step starts and the decision core fails the step when `DeadlineExpired` arrives first
(`gpuop.events.deadlines`). Upstream's own timeouts (`waitForCompletion`, `podDeletion`,
`drain`) are still honoured, and a 0 there is accepted, but the deadline applies regardless.

`Retry` is how a node in `upgrade-failed` gets another try: after a backoff that doubles per
failed attempt up to a cap, and at most `maxAttempts` tries in all. Both are read by the
decision core; neither sleeps (time is a dependency, `gpuop.clocks`): backoffs become
deadlines too.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from gpuop.policy.fields import MAX_SECONDS, DeadlineSeconds, Section


class Deadlines(Section):
    """The longest each step of a node's upgrade may take, in seconds (all at least 1).

    A step still running at its deadline fails, with the step and the deadline in the
    reason; the saga then compensates (`gpuop.saga.upgrade.compensation`). These bound every
    wait, also where an upstream `timeoutSeconds` is 0 ("forever")."""

    cordon: DeadlineSeconds = 120
    """Marking the node unschedulable, until the API server confirms it."""
    wait_for_jobs: DeadlineSeconds = 3600
    """Waiting for the jobs that `waitForCompletion.podSelector` selects to finish."""
    pod_deletion: DeadlineSeconds = 600
    """Deleting the node's GPU pods until they are gone."""
    drain: DeadlineSeconds = 900
    """Draining the node, when `drain.enable` is true."""
    operands_pause: DeadlineSeconds = 300
    """Pausing the node's operands (device plugin, telemetry) and waiting for each to confirm."""
    driver_stage: DeadlineSeconds = 900
    """Fetching, verifying and checking the new driver package against the node's kernel,
    before the node is cordoned."""
    driver_unload: DeadlineSeconds = 300
    """Unloading the running driver's kernel modules."""
    driver_install: DeadlineSeconds = 900
    """Fetching, verifying and installing the new driver package."""
    driver_load: DeadlineSeconds = 300
    """Loading the new driver's kernel modules."""
    validation: DeadlineSeconds = 600
    """Validating the loaded driver (devices visible, operands healthy): the ladder's NVML
    rung."""
    validation_cuda: DeadlineSeconds = 300
    """The ladder's CUDA rung: a context on every GPU."""
    validation_peermem: DeadlineSeconds = 120
    """The ladder's peermem rung: `nvidia_peermem` registered with the RDMA core."""
    validation_pod: DeadlineSeconds = 600
    """The ladder's pod rung: a pod requesting one GPU run to completion on the node."""
    runtime_configure: DeadlineSeconds = 300
    """Configuring the container runtime: its drop-in, its restart, and its answer."""
    reboot: DeadlineSeconds = 900
    """A reboot, until discovery reports the node's new boot id."""
    rollback: DeadlineSeconds = 900
    """Restoring the previous driver after a failure past the unload."""
    uncordon: DeadlineSeconds = 120
    """Making the node schedulable again, until the API server confirms it."""


class Retry(Section):
    """How a node whose upgrade failed is tried again."""

    max_attempts: int = Field(default=3, ge=1, le=1000)
    """Tries of one node's upgrade to the same desired versions, the first included. After
    the last one fails the node stays cordoned in `upgrade-failed` with its reason until the
    desired versions change. 1 means no retry."""
    backoff_seconds: int = Field(default=60, ge=0, le=MAX_SECONDS)
    """Wait before the second try; each further try waits twice as long as the one before."""
    max_backoff_seconds: int = Field(default=900, ge=0, le=MAX_SECONDS)
    """The longest wait between two tries; at least `backoffSeconds`."""

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> Retry:
        if self.max_backoff_seconds < self.backoff_seconds:
            raise PydanticCustomError(
                "backoff_cap",
                "must be at least backoffSeconds ({backoff})",
                {"field": "maxBackoffSeconds", "backoff": self.backoff_seconds},
            )
        return self

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after try number `attempt` (1 for the first) failed, before the
        next: `backoffSeconds * 2 ** (attempt - 1)`, capped at `maxBackoffSeconds`."""
        if attempt < 1:
            raise ValueError(f"attempts count from 1, got {attempt}")
        if self.backoff_seconds == 0:
            return 0.0
        # Doubling past the cap is pointless and 2**attempt overflows a float eventually.
        doublings = min(attempt - 1, MAX_SECONDS.bit_length())
        return float(min(self.backoff_seconds * 2**doublings, self.max_backoff_seconds))
