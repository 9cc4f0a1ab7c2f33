"""`gpuop demo --scenario remediation|mig|dra` as a person runs it, headless: real processes, a
real nats-server, the simulated cluster; each ends with its JSON summary checked for what
must have happened, and its recorded log replays identically."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuop_sim.cli import screens
from tests.support.processes import gpuop
from tests.support.terminals import Terminal

SIZE = ("--nodes", "2", "--gpus", "8")
"""Two nodes of eight GPUs: each runs two GPU pods (llm-inference, embeddings) on different
GPUs, so a fault on one GPU has a pod to evict and one to keep."""


async def play(scenario: str, record: Path) -> tuple[str, dict[str, Any]]:
    code, out, err = await gpuop(
        "demo", "--scenario", scenario, "--headless", *SIZE, "--record", str(record),
        timeout=300,
    )  # fmt: skip
    assert code == 0, err + out
    return out, json.loads(out.strip().splitlines()[-1])


async def replays_identically(record: Path) -> None:
    code, out, err = await gpuop("replay", str(record))
    assert code == 0, err + out
    assert "for 2 nodes" in out and "identical" in out, out


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_a_gpu_fallen_off_the_bus_twice_is_handed_over_and_an_nvlink_storm_reset(
    tmp_path: Path,
) -> None:
    record = tmp_path / "remediation.jsonl"
    out, summary = await play("remediation", record)

    assert (summary["scenario"], summary["targets"], summary["done"], summary["failed"]) == (
        "remediation", 2, 1, 0,
    )  # fmt: skip
    fall, storm = summary["remediated"]["gpu-node-1"], summary["remediated"]["gpu-node-2"]
    assert (fall["fault"], storm["fault"]) == ("fallen-off-the-bus", "nvlink-storm")
    for seen in (fall, storm):
        assert seen["quarantined"], seen
        assert seen["quarantine_condition"]["status"] == "False"
        assert seen["evicted"] == seen["on_faulty_gpu"] != [], seen
        assert seen["kept"] and not set(seen["kept"]) & set(seen["evicted"]), seen
    # the first fall: NVIDIA's reboot; the second, in the new boot: new hardware
    assert fall["first"]["state"] == "remediation-done", fall
    assert "reboot-required" in fall["first"]["states"], fall
    assert f"{fall['gpu']} (XID 79)" in fall["quarantine_condition"]["message"]
    assert fall["state"] == "hardware-replacement-required", fall
    assert fall["gpuop.io/hardware-replacement"] == "required" and fall["cordoned"], fall
    # the storm: a reset, then released
    assert storm["state"] == "remediation-done", storm
    assert "gpu-reset-required" in storm["states"] and "reboot-required" not in storm["states"]
    assert storm["condition"]["status"] == "True" and not storm["tainted"], storm
    assert storm["evicted"] == storm["holders"], storm
    assert re.search(r"\] gpu-node-1\s+remediation: .* -> hardware-replacement-required", out)
    assert re.search(r"\] gpu-node-2\s+remediation: release-required -> remediation-done", out)
    await replays_identically(record)


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_two_nodes_relabelled_to_a_mixed_layout_advertise_its_mig_devices(
    tmp_path: Path,
) -> None:
    record = tmp_path / "mig.jsonl"
    out, summary = await play("mig", record)

    expected = {"nvidia.com/mig-1g.18gb": 16, "nvidia.com/mig-2g.35gb": 8,
                "nvidia.com/mig-3g.71gb": 8}  # fmt: skip
    assert summary["expected"] == expected
    assert (summary["scenario"], summary["targets"], summary["done"], summary["failed"]) == (
        "mig", 2, 2, 0,
    )  # fmt: skip
    for node, seen in summary["reconfigured"].items():
        assert (seen["state"], seen["config_state"]) == ("mig-config-done", "success"), seen
        assert seen["allocatable_before"] == {"nvidia.com/gpu": "8"}, seen
        after = seen["allocatable_after"]
        assert {r: int(n) for r, n in after.items() if "mig-" in r} == expected, seen
        assert after["nvidia.com/gpu"] == "0"
        labels = {k.removesuffix(".count"): int(v) for k, v in seen["labels_after"].items()}
        assert labels == expected, seen  # GFD's nvidia.com/mig-<profile>.count
        assert seen["evicted"] == seen["holders"] != [] and not seen["kept"], seen
        assert re.search(rf"\] {node}\s+mig: operands-resume-required -> mig-config-done", out)
    await replays_identically(record)


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_two_nodes_switch_to_dra_once_the_kubelet_registers_their_dra_plugin(
    tmp_path: Path,
) -> None:
    out, summary = await play("dra", tmp_path / "dra.jsonl")

    assert (summary["scenario"], summary["targets"]) == ("dra", 2), summary
    assert len(summary["switched"]) == 2, summary
    for node, seen in summary["switched"].items():
        assert (seen["state"], seen["api"]) == ("device-api-done", "dra"), seen
        assert "api-switch-required" in seen["states"], seen
        assert re.search(rf"\] {node}\s+device-api: api-switch-required -> validation-required"
                         r".*DeviceApiApplied: dra serving", out), out  # fmt: skip
    for node, claim in summary["claims"].items():
        assert claim["phase"] == "Running", claim
        assert claim["claim"] == f"{claim['pod']}-gpu", claim
        (result,) = claim["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", node), claim
    assert summary["fault"]["node"] in summary["switched"], summary  # reported, not judged


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--scenario", "reboot"], "--scenario"),
        (["--scenario", "mig", "--kubeconfig", "/nonexistent"], "simulated cluster only"),
    ],
)
async def test_the_demo_refuses_an_unknown_scenario_and_one_on_a_real_cluster(
    flags: list[str], named: str
) -> None:
    code, _, err = await gpuop("demo", *flags)
    assert code == 2 and named in err, err


async def test_help_names_the_scenarios() -> None:
    code, out, _ = await gpuop("demo", "--help")
    assert code == 0
    assert "--scenario {upgrade,remediation,mig,dra}" in out.replace("\n", " "), out
    assert "dra: two nodes switched to DRA" in " ".join(out.split()), out


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_remediation_shows_live_with_each_nodes_saga_kind_and_state() -> None:
    async with Terminal("demo", "--scenario", "remediation", *SIZE) as terminal:
        code = await terminal.exit_code(240)
    out = terminal.text
    assert code == 0, out
    assert screens.HIDE_CURSOR in out and out.count("\x1b[") > 50  # redrawn in place
    last = out[out.rindex("GPU remediation on 2 of 2 nodes") :]
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", last)
    assert re.search(r"^NODE\s+SAGA\s+STATE\s+ATTEMPT", frame, re.M), frame
    ended = {"gpu-node-1": "hardware-replacement-required", "gpu-node-2": "remediation-done"}
    for node, state in ended.items():
        assert re.search(rf"^{node}\s+remediation\s+{state}\s+1\s", frame, re.M), frame
    assert "] 1/2 done, 0 failed, 1 remediating" in frame
    assert "remediation.state-changed" in frame
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["scenario"], summary["done"]) == ("remediation", 1)
