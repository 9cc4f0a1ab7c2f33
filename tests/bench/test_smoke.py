"""Every benchmark still runs: each script of tests/bench at its smoke size (`--smoke`), as a
subprocess, in CI's slow stage (the side by side with upstream, which needs the real control
plane and upstream's harness, with the `real_cluster` suites). No target is judged; a script
that fails, hangs past its limit or ends without its JSON line fails here, not at the next
`make bench`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import run_all

SCRIPTS = run_all.benchmarks()


def _case(script: Path) -> object:
    marks = [pytest.mark.slow, pytest.mark.timeout(run_all.smoke_limit(script) + 30)]
    if script.stem in run_all.NEEDS_CONTROL_PLANE:
        marks.append(pytest.mark.real_cluster)
    return pytest.param(script, id=script.stem, marks=marks)


@pytest.mark.parametrize("script", [_case(script) for script in SCRIPTS])
def test_the_benchmark_runs_at_its_smoke_size(script: Path) -> None:
    outcome = run_all.smoke(script)
    assert outcome.ok, f"{outcome.command}: {outcome.error}"
    assert outcome.result is not None
    assert outcome.result.get("mode", "smoke") == "smoke", "the script ignored --smoke"
