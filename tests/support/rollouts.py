"""What the rollout tests share: the e2e rollout's policy, its done check, the parsed log, and
the GPUClusterPolicy CRD installed as the chart ships it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes.aio import client as k8s

from gpuop.events.upgrade import UpgradeState
from gpuop.kube import client
from gpuop.policy import crd
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from tests.support.stack import Stack

REPO = Path(__file__).resolve().parents[2]
MAX_PARALLEL, MAX_UNAVAILABLE = 4, "25%"
ALLOWED_UNAVAILABLE = 4
ROLLOUT_TIMEOUT = 300.0
S = UpgradeState


def upgrade_policy(max_parallel: int = MAX_PARALLEL) -> dict[str, Any]:
    return {
        "maxParallelUpgrades": max_parallel,
        "maxUnavailable": MAX_UNAVAILABLE,
        "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "drain": {"enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "rebootOnUnloadFailure": True,
        "rollbackOnFailure": True,
        "retry": {"maxAttempts": 3, "backoffSeconds": 10, "maxBackoffSeconds": 10},
        "deadlines": {"validation": 8, "driverUnload": 20},
    }


async def every_node_done(running: Stack) -> bool:
    labels = await running.labels()
    return all(found.get(STATE_LABEL) == S.UPGRADE_DONE for found in labels.values())


def log_of(lines: list[str], keep: Path) -> list[replaying.Recorded]:
    """The parsed log; the export is kept in `keep` to look at when a check fails."""
    keep.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return replaying.parse_log(lines)


async def install_crd(kube: client.Kube) -> None:
    definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
    await k8s.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(definition)
