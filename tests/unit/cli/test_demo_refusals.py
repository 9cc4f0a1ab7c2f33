"""A cluster that cannot take the demo's nodes or workloads (`gpuop demo --kubeconfig` on a
cluster that already runs them) is refused in one line that says what to do, not a traceback."""

from __future__ import annotations

import argparse

import pytest

from gpuop.cli import main as cli
from gpuop_sim.cli import demo
from gpuop_sim.cluster.kwok import FleetError


def test_a_cluster_that_refuses_the_fleet_ends_the_demo_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    async def refused(args: argparse.Namespace, stop: object) -> int:
        raise FleetError("namespace gpu-operator already exists: the demo makes its own")

    monkeypatch.setattr(demo, "_run", refused)
    kubeconfig = f"{tmp_path}/admin.kubeconfig"
    assert cli.main(["demo", "--headless", "--kubeconfig", kubeconfig]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err == "gpuop demo: namespace gpu-operator already exists: the demo makes its own\n"
