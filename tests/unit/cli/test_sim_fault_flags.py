"""`gpuop sim apiserver`'s fault flags: the plan they build, and the usage errors for values
that make no sense."""

from __future__ import annotations

import pytest

from gpuop.cli import main
from gpuop_sim.cli import sim

BASE = ["sim", "apiserver", "--kubeconfig-out", "kubeconfig"]


def test_without_fault_flags_the_server_never_fails_on_purpose() -> None:
    plan = sim.fault_plan(main.parser().parse_args(BASE))

    assert not plan.active
    assert sim.describe(plan) == "faults: none"


def test_the_fault_flags_build_the_plan() -> None:
    rates = ["--error-rate", "0.1", "--throttle-rate", "0.05", "--retry-after", "0.5"]
    args = main.parser().parse_args([*BASE, *rates, "--watch-drop-seconds", "20", "--seed", "4"])

    plan = sim.fault_plan(args)

    assert (plan.error_rate, plan.throttle_rate, plan.retry_after) == (0.1, 0.05, 0.5)
    assert plan.watch_drop_seconds == 20
    assert sim.describe(plan) == (
        "faults: 10% of requests answer 500, 5% answer 429 (Retry-After 0.5s), "
        "watches end after 20s on average"
    )


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--error-rate", "1.5", "expected a share between 0 and 1, got '1.5'"),
        ("--throttle-rate", "-0.1", "expected a share between 0 and 1, got '-0.1'"),
        ("--error-rate", "ten", "expected a share between 0 and 1, got 'ten'"),
        ("--retry-after", "0", "expected a positive number of seconds, got '0'"),
        ("--watch-drop-seconds", "-5", "expected a positive number of seconds, got '-5'"),
        ("--watch-drop-seconds", "inf", "expected a positive number of seconds, got 'inf'"),
        ("--watch-drop-seconds", "nan", "expected a positive number of seconds, got 'nan'"),
    ],
)
def test_a_bad_fault_value_is_a_usage_error_naming_the_flag(
    flag: str, value: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main.parser().parse_args([*BASE, flag, value])

    assert exited.value.code == 2
    assert f"argument {flag}: {expected}" in capsys.readouterr().err


def test_rates_that_add_up_to_more_than_all_requests_are_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main.main([*BASE, "--error-rate", "0.6", "--throttle-rate", "0.5"])

    assert code == 2
    assert capsys.readouterr().err == (
        "gpuop sim apiserver: --error-rate 0.6 --throttle-rate 0.5: together they exceed 1\n"
    )
