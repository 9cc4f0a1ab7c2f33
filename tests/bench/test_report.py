"""BENCHMARKS.md's sections: a target per figure judged, and the load each run was on."""

from __future__ import annotations

import pytest

from tests.bench.run_all import (
    Load,
    Outcome,
    benchmarks,
    cpu_busy,
    judged,
    merged,
    report,
    script_args,
    section,
    title,
    verdicts,
)


@pytest.mark.parametrize(
    ("target", "value", "met"),
    [
        ("<= 200", 199.9, True),
        ("<= 200", 200, True),
        ("<= 200", 200.1, False),
        (">= 0.8", 0.79, False),
        ("< 2", 2, False),
        ("> 1", 1.5, True),
        ("<= 200", None, None),  # not measured: neither met nor missed
        ("<= 200", True, None),
        ("about 200", 150, None),
        ("<= lots", 150, None),
    ],
)
def test_a_figure_is_judged_against_its_target(target: str, value: object, met: bool | None):
    assert judged(target, value) is met


def test_a_section_tables_each_figure_with_its_target_and_says_the_load() -> None:
    result = {"about": "x", "target": "t", "target_met": False,
              "targets": {"rss_mb": "<= 200", "cpu": "<= 0.5"},
              "rss_mb": 250.0, "cpu": 0.2, "mode": "full"}  # fmt: skip
    quiet = Outcome("footprint", "cmd", 0, result, None, Load(0.3, 1.1, 1.9, 2, 0.05))
    lines = section(quiet)
    assert "| rss_mb | 250 | <= 200 | **no** |" in lines
    assert "| cpu | 0.2 | <= 0.5 | yes |" in lines
    assert "| mode | full |  |  |" in lines
    said = next(line for line in lines if line.startswith("Load average"))
    assert said.split(": ", 1)[1] == (
        "mean 1.10, peak 1.90, 0.30 at its start, on 2 CPUs; 5% of the CPUs busy just before it."
    )
    busy = Outcome("footprint", "cmd", 0, result, None, Load(0.2, 2.5, 3.0, 2, 0.6))
    assert any("a loaded machine" in line for line in section(busy))


def test_a_failed_run_still_says_its_load() -> None:
    failed = Outcome("soak", "cmd", 1, None, "exit status 1", Load(0.0, 0.5, 0.5, 2))
    lines = section(failed)
    assert "**Failed**: exit status 1." in lines
    assert any(line.startswith("Load average") for line in lines)


def test_the_report_tests_are_no_benchmark() -> None:
    names = {script.stem for script in benchmarks()}
    assert "test_report" not in names
    assert {"footprint", "rollout", "device_plugin"} <= names


def test_how_busy_the_cpus_are_is_a_share_between_none_and_all() -> None:
    assert 0.0 <= cpu_busy(0.2) <= 1.0


def test_a_second_partial_run_keeps_the_date_of_the_sections_it_did_not_run() -> None:
    original = "# B\n\n- Date: 2026-11-30 04:02 UTC\n\n## bus\n\nold bus\n\n## rollout\n\nold\n"
    fresh = "# B\n\n- Date: 2026-12-02 02:45 UTC\n\n## rollout\n\nnew\n"
    once = merged(original, fresh, {"rollout"})
    assert "the other sections are from 2026-11-30 04:02 UTC" in once
    again = merged(once, fresh.replace("02:45", "02:53"), {"rollout"})
    assert "the other sections are from 2026-11-30 04:02 UTC" in again
    assert "old bus" in again and "\nnew\n" in again


def test_a_full_run_and_a_quick_run_of_one_benchmark_keep_a_section_each() -> None:
    command = "```\n.venv/bin/python -m tests.bench.rollout{}\n```\n\n"
    original = (
        "# B\n\n- Date: 2026-11-30 04:02 UTC\n- Mode: quick\n\n"
        f"## bus\n\n{command.format('')}old bus\n\n"
        f"## rollout\n\n{command.format(' --quick')}old quick\n"
    )
    full = (
        "# B\n\n- Date: 2026-12-03 20:10 UTC\n- Mode: full\n\n"
        f"## rollout\n\n{command.format('')}new full\n"
    )
    once = merged(original, full, {"rollout"})
    # the section written before quick ones had their title is recognised by its command
    assert "## rollout (quick)\n" in once and "old quick" in once
    assert "## rollout\n" in once and "new full" in once and "old bus" in once
    assert once.index("new full") < once.index("old quick")
    assert "- Mode: full" not in once and "- Mode: each section's own" in once
    quick = full.replace("new full", "new quick").replace("rollout\n```", "rollout --quick\n```")
    quick = quick.replace("## rollout\n", "## rollout (quick)\n")
    again = merged(once, quick, {"rollout"})
    assert "new quick" in again and "old quick" not in again and "new full" in again
    assert again.count("## rollout (quick)") == 1
    assert title("rollout", ".venv/bin/python -m tests.bench.rollout --quick") == "rollout (quick)"
    assert title("rollout", ".venv/bin/python -m tests.bench.rollout") == "rollout"


def test_script_args_give_each_named_benchmark_its_own_arguments() -> None:
    given = ["vs_upstream=--slow", "vs_upstream=--only 'kill' slow", "bus="]
    assert script_args(given, {"vs_upstream", "bus"}) == {
        "vs_upstream": ["--slow", "--only", "kill", "slow"],
        "bus": [],
    }
    with pytest.raises(ValueError, match="no benchmark named 'vs-upstream'"):
        script_args(["vs-upstream=--slow"], {"vs_upstream"})
    with pytest.raises(ValueError, match="no benchmark named '--slow'"):
        script_args(["--slow"], {"vs_upstream"})


def test_the_report_says_which_targets_each_benchmark_met_before_its_sections() -> None:
    per_figure = {"targets": {"rss_mb": "<= 200", "cpu": "<= 0.5", "gone": "<= 1"},
                  "rss_mb": 250.0, "cpu": 0.2, "name": "x"}  # fmt: skip
    one = {"target": "ratio >= 0.8", "target_met": True, "ratio": 0.9}
    outcomes = [
        Outcome("footprint", "cmd", 0, per_figure, None),
        Outcome("bus", "cmd", 0, one, None),
        Outcome("soak", "cmd", 1, None, "exit status 1"),
        Outcome("scale", "cmd", 0, {"target": "t"}, None),
        Outcome("device_plugin", "cmd", 0, {"p99": 1.0}, None),
    ]

    assert verdicts(outcomes[0]) == [
        "footprint: rss_mb 250.0 (target <= 200): **not met**",
        "footprint: cpu 0.2 (target <= 0.5): met",
    ]  # a target whose figure the run did not report is left out
    assert verdicts(outcomes[1]) == ["bus: ratio >= 0.8: met"]
    assert verdicts(outcomes[2]) == ["soak: **failed** (exit status 1)"]
    assert verdicts(outcomes[3]) == ["scale: t: not judged"]
    assert verdicts(outcomes[4]) == ["device_plugin: no target"]
    written = report(outcomes, quick=True)
    said = written.split("Targets of this run:\n\n", 1)[1].split("\n\n", 1)[0]
    assert said.splitlines() == [f"- {line}" for outcome in outcomes for line in verdicts(outcome)]
    assert written.index("Targets of this run:") < written.index("## footprint")
