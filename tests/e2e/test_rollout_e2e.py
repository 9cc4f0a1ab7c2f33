"""A rolling GPU driver upgrade of 16 nodes end to end, with real processes and a real
nats-server (`stack`), checked on the recorded event log (`invariants`):

- maxParallelUpgrades 4, maxUnavailable 25%, GPU workloads under PodDisruptionBudgets;
- on one node something holds the `nvidia` module, so the unload fails with the module in
  use and, as the policy allows, the node takes the reboot path;
- one node runs another kernel build whose package of the new driver is defective (it loads
  but brings up no GPU): validation fails, the node rolls back to the old driver, validates
  it, is uncordoned and ends its first attempt upgrade-failed with the reason; the package
  is then fixed in the driver source, and the retry succeeds;
- every other node ends upgrade-done;
- the exported log replays to the same decisions, and diverges under a changed policy.

The chaos test rolls 16 nodes while the leading orchestrator replica process is SIGKILLed 20
times, each at a random moment of its leadership, a second replica always running (and a
new one started after each kill); the same invariants hold, no node fails, and the log
still replays.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.bus import NatsServer
from tests.support.rollout_scenarios import roll_sixteen_nodes, roll_through_leader_kills

pytestmark = [pytest.mark.nats, pytest.mark.slow]


@pytest.mark.timeout(420)
async def test_sixteen_nodes_roll_with_a_reboot_and_a_failed_validation_retried(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    await roll_sixteen_nodes(nats_server, tmp_path)


@pytest.mark.timeout(480)
async def test_the_rollout_survives_twenty_sigkills_of_the_orchestrator(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    await roll_through_leader_kills(nats_server, tmp_path)
