"""The validation ladder in the decision core: the policy's rungs as steps of
validation-required, each with its own deadline and failure reason, any failed rung rolling
back; the pod rung's resume of the operands and the pause again before a rollback."""

from __future__ import annotations

import pytest

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.policy import GPUClusterPolicySpec, PolicyInvalid, validate_spec
from gpuop.saga import actions
from gpuop.saga.upgrade.steps import StepKind
from tests.support.sagas import VALIDATION_POD, Run, S, policy

LADDER_TOKENS = ["validate-gpu", "validate-cuda-gpu", "validate-resume", "validate-pod"]


def climb(spec: GPUClusterPolicySpec) -> Run:
    run = Run(spec)
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    return run


def tokens_in_validation(run: Run) -> list[str]:
    return [r.step for r in run.saga.history if r.state is S.VALIDATION_REQUIRED]


def test_the_default_ladder_is_nvml_cuda_then_a_pod_after_resuming_the_operands():
    run = climb(policy())
    run.until(S.UPGRADE_DONE)

    assert tokens_in_validation(run) == LADDER_TOKENS
    work = run.work()
    assert work[work.index("validate:gpu") :] == [
        "validate:gpu",
        "validate-cuda:gpu",
        "resume",
        "runvalidationpod",
        "uncordon",  # the operands run already: the uncordon resumes nothing
    ]
    assert not run.saga.operands_paused and run.saga.failure is None


def test_each_rung_arms_its_own_deadline_from_the_policy():
    deadlines = {
        "validation": 100,
        "validation_cuda": 200,
        "validation_peermem": 300,
        "validation_pod": 400,
        "operands_pause": 50,
    }
    run = climb(
        policy(
            ofed=True, deadlines=deadlines, validation={"rungs": ["pod", "peermem", "cuda", "nvml"]}
        )
    )
    seen = {}
    while run.state is S.VALIDATION_REQUIRED:
        assert run.saga.deadline is not None
        seen[run.saga.step.token] = (run.saga.deadline - run.saga.step_started).total_seconds()
        run.ok()
    assert seen == {
        "validate-gpu": 100,
        "validate-ofed": 100,
        "validate-cuda-gpu": 200,
        "validate-peermem-gpu": 300,
        "validate-resume": 50,
        "validate-pod": 400,
    }


def test_the_driver_rungs_ask_the_driver_manager_for_their_check_with_90_percent_of_the_deadline():
    run = climb(policy(ofed=True, validation={"rungs": ["nvml", "cuda", "peermem"]}))
    run.until(S.UPGRADE_DONE)
    checks = [
        (c.step, c.payload.check, c.payload.timeout_seconds)
        for c in run.commands()
        if isinstance(c.payload, dm.ValidateDriver)
    ]
    assert checks == [
        ("validate-gpu", dm.ValidationCheck.NVML, 540),
        ("validate-ofed", dm.ValidationCheck.NVML, 540),
        ("validate-cuda-gpu", dm.ValidationCheck.CUDA, 270),
        ("validate-peermem-gpu", dm.ValidationCheck.PEERMEM, 108),
    ]


def test_peermem_is_checked_only_when_ofed_is_in_the_window():
    run = climb(policy(validation={"rungs": ["nvml", "peermem"]}))
    run.until(S.UPGRADE_DONE)
    assert tokens_in_validation(run) == ["validate-gpu"]


def test_nvml_alone_is_the_ladder_before_it_existed():
    run = climb(policy(validation={"rungs": ["nvml"]}))
    run.until(S.UPGRADE_DONE)
    work = run.work()
    assert work[work.index("validate:gpu") :] == ["validate:gpu", "resume", "uncordon"]


def test_the_pod_carries_the_policys_image_command_namespace_and_timeout():
    pod = {"image": "registry.local/cuda:12", "command": ["/bin/check", "--all"],
           "namespace": "gpu-ops", "runtime_class_name": "nvidia"}  # fmt: skip
    run = climb(policy(validation={"pod": pod}))
    while run.saga.step.kind is not StepKind.VALIDATE_POD:
        run.ok()
    (run_pod,) = [
        a for a in run.decisions[-1].kube_actions if isinstance(a, actions.RunValidationPod)
    ]
    assert run_pod == actions.RunValidationPod(
        id=run.step_id,
        image="registry.local/cuda:12",
        command=("/bin/check", "--all"),
        namespace="gpu-ops",
        runtime_class_name="nvidia",
        timeout_seconds=540,
    )


def test_a_failed_cuda_rung_rolls_back_with_its_reason():
    run = climb(policy())
    run.ok()  # nvml
    assert run.saga.step.token == "validate-cuda-gpu"
    run.fail("cuInit failed: CUDA_ERROR_NO_DEVICE (100)")
    assert run.state is S.ROLLBACK_REQUIRED
    error = run.saga.failure.reason
    assert error.startswith("validate-cuda-gpu (cuda-failed): DriverValidationFailed gpu")
    assert "CUDA_ERROR_NO_DEVICE (100)" in error
    # the operands are still paused: the rollback starts at once, without a pause again
    assert run.saga.step.kind is StepKind.ROLLBACK
    run.until(S.UPGRADE_FAILED)
    assert run.states()[-4:] == [
        S.ROLLBACK_REQUIRED, S.VALIDATION_REQUIRED, S.UNCORDON_REQUIRED, S.UPGRADE_FAILED,
    ]  # fmt: skip
    assert "cuda-failed" in run.saga.failure.reason


def test_a_failed_peermem_rung_rolls_back_with_its_reason():
    run = climb(policy(ofed=True, validation={"rungs": ["nvml", "peermem"]}))
    while run.saga.step.kind is not StepKind.VALIDATE_PEERMEM:
        run.ok()
    run.fail("nvidia_peermem is not loaded")
    assert run.state is S.ROLLBACK_REQUIRED
    assert run.saga.failure.reason.startswith("validate-peermem-gpu (peermem-not-registered)")
    rolled = [c.payload.component for c in run.decisions[-1].commands]
    assert rolled == [dm.Component.GPU]  # in unload order, GPU first


def test_a_failed_pod_pauses_the_operands_again_before_the_rollback_and_resumes_them_after():
    run = climb(policy())
    while run.saga.step.kind is not StepKind.VALIDATE_POD:
        run.ok()
    assert not run.saga.operands_paused
    run.fail("validator exited 1")
    assert run.state is S.ROLLBACK_REQUIRED
    assert run.saga.failure.reason.startswith(f"validate-pod: pod {VALIDATION_POD} failed")
    assert run.saga.step.token == "operands-pause-2" and run.saga.operands_paused
    (pause,) = run.decisions[-1].commands
    assert isinstance(pause.payload, dev.PauseOperands) and pause.step == "operands-pause-2"
    run.until(S.UPGRADE_FAILED)
    work = run.work()
    assert work[work.index("runvalidationpod") :] == [
        "runvalidationpod",
        "pause",
        "rollback:gpu",
        "validate:gpu",
        "resume",
        "uncordon",
    ]
    assert run.saga.failure is not None and "validate-pod" in run.saga.failure.reason


def test_the_rollback_waits_for_every_operand_to_pause_again():
    run = climb(policy())
    while run.saga.step.kind is not StepKind.VALIDATE_POD:
        run.ok()
    run.fail("validator exited 1")
    first, *rest = run.saga.operands
    run.feed(dev.OperandPaused(command_id=run.step_id, service=first))
    run.feed(dev.OperandPaused(command_id="another-command", service=rest[0]))
    assert run.saga.step.token == "operands-pause-2"
    for service in rest:
        run.feed(dev.OperandPaused(command_id=run.step_id, service=service))
    assert run.saga.step.kind is StepKind.ROLLBACK


@pytest.mark.parametrize("token", ["validate-cuda-gpu", "validate-resume", "validate-pod"])
def test_a_rung_past_its_deadline_rolls_back(token):
    run = climb(policy())
    while run.saga.step.token != token:
        run.ok()
    run.expire()
    assert run.state is S.ROLLBACK_REQUIRED
    assert run.saga.failure.reason.startswith(f"{token} did not finish within")


def test_answers_to_other_pods_and_earlier_attempts_are_ignored():
    run = climb(policy())
    while run.saga.step.kind is not StepKind.VALIDATE_POD:
        run.ok()
    run.feed(kube.ValidationPodSucceeded(action_id="someone-else", pod=VALIDATION_POD))
    run.feed(kube.DrainCompleted(action_id=run.step_id, evicted=0))
    assert run.saga.step.kind is StepKind.VALIDATE_POD
    run.feed(kube.ValidationPodSucceeded(action_id=run.step_id, pod=VALIDATION_POD))
    assert run.state is S.UNCORDON_REQUIRED


def test_policies_without_a_validation_section_keep_their_meaning_with_the_default_rungs():
    old = {"driver": {"gpu": {"version": "580.95.05"}}, "upgradePolicy": {"maxUnavailable": 2}}
    spec = validate_spec(old)
    assert spec.upgrade_policy.validation.ladder() == ("nvml", "cuda", "pod")
    wire = validate_spec({**old, "upgradePolicy": {"validation": {"rungs": ["pod", "nvml"]}}})
    assert wire.upgrade_policy.validation.ladder() == ("nvml", "pod")


@pytest.mark.parametrize(
    ("rungs", "words"),
    [(["cuda", "pod"], "must include nvml"), (["nvml", "nvml"], "twice"), ([], "must not be empty"),
     (["nvml", "dcgm"], "nvml")],
)  # fmt: skip
def test_a_ladder_without_nvml_or_with_an_unknown_rung_is_refused(rungs, words):
    spec = {
        "driver": {"gpu": {"version": "580.95.05"}},
        "upgradePolicy": {"validation": {"rungs": rungs}},
    }
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(spec)
    assert "upgradePolicy.validation.rungs" in str(refused.value)
    assert words in str(refused.value)
