"""The preflight rung in the decision core and the policy: the admin's diagnostic, in a pod
holding every GPU of the cordoned node, after the pod rung, with its own deadline; a failing
diagnostic rolls the upgrade back with the diagnostic's last log lines as the reason; a
ladder naming the rung without a diagnostic image is refused."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.policy import PolicyInvalid, validate_spec
from gpuop.saga import actions
from gpuop.saga.upgrade.steps import StepKind
from tests.support.sagas import VALIDATION_POD, Run, S, policy

DCGM = {"image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        "command": ["dcgmi", "diag", "-r", "1"], "deadline_seconds": 1000}  # fmt: skip
WITH_PREFLIGHT = {"rungs": ["nvml", "pod", "preflight"], "preflight": DCGM}


def climb(validation: dict[str, Any]) -> Run:
    run = Run(policy(validation=validation))
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    return run


def until_preflight(run: Run) -> actions.RunValidationPod:
    while run.saga.step.kind is not StepKind.VALIDATE_PREFLIGHT:
        run.ok()
    (pod,) = [a for a in run.decisions[-1].kube_actions if isinstance(a, actions.RunValidationPod)]
    return pod


def test_the_preflight_rung_runs_the_diagnostic_on_every_gpu_after_the_pod_then_uncordons():
    run = climb(WITH_PREFLIGHT)
    pod = until_preflight(run)

    tokens = [r.step for r in run.saga.history if r.state is S.VALIDATION_REQUIRED]
    assert tokens == ["validate-gpu", "validate-resume", "validate-pod"]
    assert pod == actions.RunValidationPod(
        id=run.step_id, image=DCGM["image"], command=("dcgmi", "diag", "-r", "1"),
        namespace="", runtime_class_name="", timeout_seconds=900, all_gpus=True,
    )  # fmt: skip
    assert run.saga.deadline is not None
    assert (run.saga.deadline - run.saga.step_started).total_seconds() == 1000
    run.ok()
    assert run.state is S.UNCORDON_REQUIRED
    assert run.saga.failure is None


def test_preflight_alone_resumes_the_operands_first():
    run = climb({"rungs": ["nvml", "preflight"], "preflight": DCGM})
    until_preflight(run)
    tokens = [r.step for r in run.saga.history if r.state is S.VALIDATION_REQUIRED]
    assert tokens == ["validate-gpu", "validate-resume"]


def test_a_failing_diagnostic_rolls_back_with_its_last_log_lines():
    run = climb(WITH_PREFLIGHT)
    until_preflight(run)
    run.fail("Failed: validator exited 226 (Error): Diagnostic ... GPU 1: Fail - SM stress")
    assert run.state is S.ROLLBACK_REQUIRED
    reason = run.saga.failure.reason
    assert reason.startswith(f"validate-preflight: pod {VALIDATION_POD} failed")
    assert "GPU 1: Fail - SM stress" in reason


def test_a_diagnostic_past_its_own_deadline_rolls_back():
    run = climb(WITH_PREFLIGHT)
    until_preflight(run)
    run.expire()
    assert run.state is S.ROLLBACK_REQUIRED
    assert "validate-preflight" in run.saga.failure.reason


def test_the_default_ladder_runs_no_diagnostic():
    run = climb({})
    run.until(S.UPGRADE_DONE)
    assert not any(r.step == "validate-preflight" for r in run.saga.history)
    assert (
        validate_spec(
            {"driver": {"gpu": {"version": "580.95.05"}}}
        ).upgrade_policy.validation.preflight
        is None
    )


def spec_with(upgrade: dict[str, Any], remediation: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": {"gpu": {"version": "580.95.05"}}, "upgradePolicy": upgrade}
    if remediation is not None:
        spec["remediation"] = remediation
    return spec


@pytest.mark.parametrize(
    ("spec", "where", "words"),
    [
        (spec_with({"validation": {"rungs": ["nvml", "preflight"]}}),
         "upgradePolicy.validation.rungs", "names no diagnostic image"),
        (spec_with({}, {"rungs": ["nvml", "preflight"]}), "remediation: rungs lists the preflight",
         "names no diagnostic image"),
        (spec_with({"validation": {"rungs": ["nvml", "preflight"],
                                   "preflight": {"command": ["dcgmi", "diag", "-r", "1"]}}}),
         "upgradePolicy.validation.preflight.image", "required"),
        (spec_with({"validation": {"preflight": {"image": "", "command": ["x"]}}}),
         "upgradePolicy.validation.preflight.image", "must not be empty"),
        (spec_with({}, {"rungs": ["preflight"]}), "remediation.rungs", "must include nvml"),
    ],
)  # fmt: skip
def test_a_preflight_rung_without_a_diagnostic_image_is_refused(spec, where, words):
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(spec)
    assert where in str(refused.value)
    assert words in str(refused.value)


def test_a_preflight_with_its_image_is_accepted_for_both_kinds():
    spec = validate_spec(
        spec_with(
            {"validation": {"preflight": {"image": DCGM["image"], "command": DCGM["command"]}}},
            {"rungs": ["nvml", "cuda", "preflight"]},
        )
    )
    assert spec.upgrade_policy.validation.ladder() == ("nvml", "cuda", "pod")
    assert spec.upgrade_policy.validation.ladder(spec.remediation.rungs) == (
        "nvml", "cuda", "preflight",
    )  # fmt: skip
    assert spec.upgrade_policy.validation.preflight is not None
    assert spec.upgrade_policy.validation.preflight.deadline_seconds == 900
