"""Runs every benchmark script in tests/bench and rewrites BENCHMARKS.md from their results.

Called by `make bench` (full size) or `.venv/bin/python -m tests.bench.run_all --quick`;
`--smoke` runs every script at its smoke size (`--smoke`: a tiny run, no target judged) and
writes nothing, as CI's slow stage does through tests/bench/test_smoke.py, so a benchmark that
no longer runs fails CI rather than the next `make bench`.
`--args NAME=ARGS` passes a script more arguments (`--args vs_upstream=--slow`), which its
section's command shows.
A benchmark is any `tests/bench/*.py` other than this file, `__init__.py`, helper modules
(names starting with `_`, or listed in `HELPERS`) and the tests of this file (`test_*.py`).
Each script accepts `--quick` and `--smoke` and prints one JSON object as its last line of
output; the figures of that object become a table.
Optional keys: `about` (a sentence on what is measured), `target` (the goal), `target_met`
(whether this run reached it) and `targets` (a target per figure, `{"figure": "<= 2"}`: the
table then shows each such figure's target and whether this run met it).

Every section also says the load average during its run (sampled every few seconds, beside
the machine's CPUs) and the load it started on: a run that began while other work kept at
least half the CPUs busy is marked as run on a loaded machine, whatever it measured.
Exits non-zero when any script fails, after writing the sections of those that succeeded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parents[1]
REPORT = ROOT / "BENCHMARKS.md"
HELPERS = frozenset({"run_all.py", "__init__.py", "conftest.py", "support.py", "helpers.py"})
TIMEOUT = {False: 900.0, True: 180.0}
"""Seconds one script may run, full and quick."""
LONG_RUNNING = {"soak": 1500.0, "cluster_rollout": 1200.0, "vs_upstream": 9000.0}
"""Full-mode limits of the scripts that run long by design: the soak runs ten minutes after
a start-up of one or two; the cluster rollout runs two whole-stack rollouts; the side by side
with upstream runs six 100-node rollouts, upstream's waiting its 2-minute requeue per wave
(quick: six 20-node rollouts, about 8 minutes on a quiet machine, more on a busy one)."""
QUICK_LONG_RUNNING = {"cluster_rollout": 600.0, "vs_upstream": 1800.0}
"""Quick-mode limits of the same (vs_upstream's with `--slow`: its slow apiserver run adds
about five minutes)."""
SMOKE_TIMEOUT = {"cluster_rollout": 240.0, "soak": 180.0, "vs_upstream": 400.0}
"""Seconds a smoke run may take, by script; others `SMOKE_DEFAULT_TIMEOUT`. Each is a few
times what the script takes on a loaded 2-core machine, so only a hang or a breakage hits it."""
SMOKE_DEFAULT_TIMEOUT = 120.0
NEEDS_CONTROL_PLANE = frozenset({"vs_upstream"})
"""Scripts that cannot run at all without the real control plane (`make cluster-tools`) and
upstream's harness (`make peer-tools`): their smoke runs with the `real_cluster` suites."""
LOAD_SAMPLE_SECONDS = 5.0
LOADED_SHARE = 0.25
"""A run is said to be on a loaded machine when, just before it starts, other work keeps at
least this share of the CPUs busy (from /proc/stat over `QUIET_SAMPLE_SECONDS`: the 1-minute
load average still remembers the script before, so it cannot tell)."""
QUIET_SAMPLE_SECONDS = 3.0
QUIET_WAIT_SECONDS = 30.0
"""How long a script waits for the machine to go quiet before it starts anyway."""
COMPARISONS = {"<=": float.__le__, ">=": float.__ge__, "<": float.__lt__, ">": float.__gt__}


@dataclass(frozen=True)
class Load:
    """The 1-minute load average around one script's run, and how busy the CPUs were just
    before it."""

    at_start: float
    mean: float
    peak: float
    cpus: int
    busy_before: float = 0.0
    """Share of all CPUs busy in the seconds before the script started."""

    @property
    def loaded(self) -> bool:
        return self.busy_before >= LOADED_SHARE

    def sentence(self) -> str:
        said = (
            f"Load average during the run: mean {self.mean:.2f}, peak {self.peak:.2f}, "
            f"{self.at_start:.2f} at its start, on {self.cpus} CPUs; "
            f"{self.busy_before:.0%} of the CPUs busy just before it"
        )
        if self.loaded:
            return said + "; **a loaded machine**: other work was running, so the figures are low."
        return said + "."


def cpu_busy(seconds: float) -> float:
    """Share of all CPUs busy over the next `seconds` (/proc/stat: all but idle and iowait)."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields) - idle, sum(fields)

    busy_before, total_before = sample()
    time.sleep(seconds)
    busy_after, total_after = sample()
    total = total_after - total_before
    return (busy_after - busy_before) / total if total > 0 else 0.0


def wait_for_quiet() -> float:
    """Wait (up to `QUIET_WAIT_SECONDS`) until other work leaves the CPUs mostly idle; how
    busy they were at the last look."""
    deadline = time.monotonic() + QUIET_WAIT_SECONDS
    while True:
        busy = cpu_busy(QUIET_SAMPLE_SECONDS)
        if busy < LOADED_SHARE or time.monotonic() >= deadline:
            return busy


class LoadWatch:
    """Samples the 1-minute load average on a thread while a script runs."""

    def __init__(self, busy_before: float = 0.0) -> None:
        self.busy_before = busy_before
        self.at_start = os.getloadavg()[0]
        self._samples = [self.at_start]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(LOAD_SAMPLE_SECONDS):
            self._samples.append(os.getloadavg()[0])

    def stop(self) -> Load:
        self._stop.set()
        self._thread.join()
        self._samples.append(os.getloadavg()[0])
        mean = sum(self._samples) / len(self._samples)
        cpus = len(os.sched_getaffinity(0))
        return Load(self.at_start, mean, max(self._samples), cpus, self.busy_before)


def judged(target: str, value: object) -> bool | None:
    """Whether `value` meets `target` ("<= 200", ">= 0.8"); None when either does not read
    as a comparison of numbers."""
    operator, _, bound = target.strip().partition(" ")
    compare = COMPARISONS.get(operator)
    if compare is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return bool(compare(float(value), float(bound)))
    except ValueError:
        return None


@dataclass(frozen=True)
class Outcome:
    """What one benchmark script produced."""

    name: str
    command: str
    returncode: int
    result: dict[str, object] | None
    error: str | None
    load: Load | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.result is not None


def benchmarks() -> list[Path]:
    return sorted(
        path
        for path in BENCH_DIR.glob("*.py")
        if path.name not in HELPERS and not path.name.startswith(("_", "test_"))
    )


def shown(path: Path) -> str:
    """`path` relative to the repository root when it lies inside it, as a user would type."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def run(script: Path, quick: bool, extra: Sequence[str] = ()) -> Outcome:
    """Run `script` (with `extra` arguments), echoing its output as it comes, and read its
    last line as JSON."""
    module = f"tests.bench.{script.stem}"  # run from the root: `tests` imports as a package
    argv = [sys.executable, "-m", module, *(["--quick"] if quick else []), *extra]
    command = shlex.join([shown(Path(sys.executable)), *argv[1:]])
    print(f"$ {command}", flush=True)
    lines: list[str] = []
    watch = LoadWatch(wait_for_quiet())
    long_running = QUICK_LONG_RUNNING if quick else LONG_RUNNING
    try:
        outcome = _run(script, argv, command, lines, long_running.get(script.stem, TIMEOUT[quick]))
    finally:
        load = watch.stop()
    return dataclasses.replace(outcome, load=load)


def smoke(script: Path) -> Outcome:
    """Run `script --smoke`, echoing its output, within its `SMOKE_TIMEOUT`."""
    argv = [sys.executable, "-m", f"tests.bench.{script.stem}", "--smoke"]
    command = shlex.join([shown(Path(sys.executable)), *argv[1:]])
    print(f"$ {command}", flush=True)
    return _run(script, argv, command, [], smoke_limit(script))


def smoke_limit(script: Path) -> float:
    """Seconds `script --smoke` may run."""
    return SMOKE_TIMEOUT.get(script.stem, SMOKE_DEFAULT_TIMEOUT)


def _run(script: Path, argv: list[str], command: str, lines: list[str], limit: float) -> Outcome:
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True, bufsize=1) as process:
        # reading the output blocks, so a hung script is killed from a timer
        watchdog = threading.Timer(limit, process.kill)
        watchdog.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                print(line, end="", flush=True)
                lines.append(line)
            returncode = process.wait()
        finally:
            timed_out = not watchdog.is_alive()
            watchdog.cancel()
    if timed_out:
        return Outcome(script.stem, command, -1, None, f"killed after {limit:.0f} s")
    if returncode != 0:
        return Outcome(script.stem, command, returncode, None, f"exit status {returncode}")
    last = next((line for line in reversed(lines) if line.strip()), "")
    try:
        result = json.loads(last)
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        return Outcome(script.stem, command, 1, None, "last line of output is not a JSON object")
    return Outcome(script.stem, command, 0, result, None)


def cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, list):
        return ", ".join(cell(item) for item in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|")


QUICK_TITLE = " (quick)"
"""What a quick run's section title adds to the benchmark's name: a benchmark's full and quick
sections are kept side by side (a 100-node run does not replace the 20-node table)."""


def title(name: str, command: str) -> str:
    """A section's title: the benchmark's name, marked when its command ran it `--quick`."""
    return name + (QUICK_TITLE if "--quick" in shlex.split(command) else "")


def section(outcome: Outcome) -> list[str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    heading = title(outcome.name, outcome.command)
    lines = [f"## {heading}", "", "```", outcome.command, "```", "", f"Run: {now}.", ""]
    if outcome.load is not None:
        lines += [outcome.load.sentence(), ""]
    if outcome.result is None:
        return [*lines, f"**Failed**: {outcome.error}.", ""]
    about = outcome.result.get("about")
    if about is not None:
        lines += [str(about), ""]
    target = outcome.result.get("target")
    if target is not None:
        met = outcome.result.get("target_met")
        verdict = "" if met is None else (" (met)" if met else " (**not met**)")
        lines += [f"Target: {target}{verdict}.", ""]
    targets = outcome.result.get("targets")
    if not isinstance(targets, dict):
        targets = {}
    figures = [
        (key, value)
        for key, value in outcome.result.items()
        if key not in ("about", "target", "target_met", "targets")
    ]
    if not targets:
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {key} | {cell(value)} |" for key, value in figures]
        return [*lines, ""]
    lines += ["| figure | value | target | met |", "|---|---|---|---|"]
    verdicts = figure_verdicts(outcome.result)
    for key, value in figures:
        target, met = verdicts.get(key, (None, None))
        shown_target = "" if target is None else cell(target)
        lines.append(
            f"| {key} | {cell(value)} | {shown_target} | {'' if met is None else cell(met)} |"
        )
    return [*lines, ""]


def figure_verdicts(result: dict[str, object]) -> dict[str, tuple[str, bool | None]]:
    """Each figure of `result` that has a target of its own: the target, and whether the
    figure met it (None when either does not read as a number)."""
    targets = result.get("targets")
    if not isinstance(targets, dict):
        return {}
    return {
        key: (str(target), judged(str(target), result[key]))
        for key, target in targets.items()
        if key in result
    }


def verdicts(outcome: Outcome) -> list[str]:
    """One line per target of `outcome`: its figures with their own targets, or else the
    benchmark's one target; a failed run says so."""
    if outcome.result is None:
        return [f"{outcome.name}: **failed** ({outcome.error})"]
    said = {True: "met", False: "**not met**", None: "not judged"}
    per_figure = figure_verdicts(outcome.result)
    if per_figure:
        return [
            f"{outcome.name}: {key} {outcome.result[key]} (target {target}): {said[met]}"
            for key, (target, met) in per_figure.items()
        ]
    target = outcome.result.get("target")
    if target is None:
        return [f"{outcome.name}: no target"]
    met = outcome.result.get("target_met")
    return [f"{outcome.name}: {target}: {said[met if isinstance(met, bool) else None]}"]


def report(outcomes: list[Outcome], quick: bool) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        "Written by `tests.bench.run_all` (`make bench`); do not edit by hand.",
        "",
        f"- Date: {now}",
        f"- Mode: {'quick' if quick else 'full'}",
        f"- CPUs (nproc): {len(os.sched_getaffinity(0))}",
        f"- Python: {platform.python_version()} ({platform.python_implementation()})",
        f"- Platform: {platform.platform()}",
        "",
        "Client, server and benchmark share the machine's cores. On a shared 2-core machine the",
        "absolute rates are noise (they move by 20% or more between runs of the same code);",
        "compare ratios measured in one run against one server, such as the bus benchmark's",
        "`ratio` (gpuop.bus over raw nats-py doing the same work).",
        "",
        "Targets of this run:",
        "",
        *(f"- {line}" for outcome in outcomes for line in verdicts(outcome)),
        "",
    ]
    for outcome in outcomes:
        lines += section(outcome)
    return "\n".join(lines).rstrip() + "\n"


def merged(previous: str, fresh: str, names: set[str]) -> str:
    """`fresh` (a report of `names` only) folded into `previous`: its sections replace those
    of the same title (a benchmark's full and quick sections are two), in the order of the
    scripts; every other section is kept as it was."""

    def sections(text: str) -> dict[str, str]:
        found = {}
        for part in text.split("\n## ")[1:]:
            heading, _, rest = part.partition("\n")
            name = heading.strip().removesuffix(QUICK_TITLE)
            # a report written before quick sections had their own title says so only in
            # its command, the first fenced line
            command = rest.split("```\n", 1)[1].split("\n", 1)[0] if "```\n" in rest else ""
            named = title(name, command) if command else heading.strip()
            found[named] = f"## {named}\n{rest}"
        return found

    kept, new = sections(previous), sections(fresh)
    order = [
        name + suffix for script in benchmarks() for name in [script.stem]
        for suffix in ("", QUICK_TITLE)
    ]  # fmt: skip
    combined = {**kept, **new}
    header = fresh.split("\n## ", 1)[0]
    lines = previous.splitlines()
    marker = "; the other sections are from "
    earlier = next((line for line in lines if line.startswith("- Re-run alone: ")), "")
    if marker in earlier:  # a report already merged: its other sections keep their date
        before = earlier.split(marker, 1)[1]
    else:
        before = next((line[8:] for line in lines if line.startswith("- Date: ")), "")
    if before:
        again = ", ".join(sorted(names))
        header = header.replace("- Date: ", f"- Re-run alone: {again}{marker}{before}\n- Date: ", 1)
    header = "\n".join(
        "- Mode: each section's own (a quick run's title says so)" if line.startswith("- Mode: ")
        else line for line in header.splitlines()
    )  # fmt: skip
    body = [combined[name].rstrip() + "\n" for name in order if name in combined]
    return header.rstrip() + "\n\n" + "\n".join(body)


def script_args(given: Sequence[str], names: set[str]) -> dict[str, list[str]]:
    """`--args` (`NAME=ARGS`, shell-quoted) as the arguments of each benchmark; ValueError
    for a name that is no benchmark."""
    extra: dict[str, list[str]] = {}
    for one in given:
        name, _, arguments = one.partition("=")
        if name not in names:
            raise ValueError(f"--args: no benchmark named {name!r}")
        extra.setdefault(name, []).extend(shlex.split(arguments))
    return extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="run every benchmark (or --only these) at its smoke size; write no report",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="run these benchmarks and replace their sections, keeping the others",
    )
    parser.add_argument(
        "--args",
        nargs="+",
        default=[],
        metavar="NAME=ARGS",
        help="more arguments for one benchmark, e.g. vs_upstream=--slow",
    )
    args = parser.parse_args(argv)
    scripts = benchmarks()
    try:
        extra = script_args(args.args, {script.stem for script in scripts})
    except ValueError as error:
        parser.error(str(error))
    if args.only:
        unknown = set(args.only) - {script.stem for script in scripts}
        if unknown:
            parser.error(f"no benchmark named {', '.join(sorted(unknown))}")
        scripts = [script for script in scripts if script.stem in args.only]
    if args.smoke:
        outcomes = [smoke(script) for script in scripts]
        return judge(outcomes, targets=False)  # a smoke size says nothing of a target
    outcomes = [run(script, args.quick, extra.get(script.stem, ())) for script in scripts]
    written = report(outcomes, args.quick)
    if args.only and REPORT.is_file():
        written = merged(REPORT.read_text(), written, set(args.only))
    REPORT.write_text(written)
    print(f"wrote {shown(REPORT)}")
    return judge(outcomes)


def judge(outcomes: Sequence[Outcome], *, targets: bool = True) -> int:
    """Print each target's verdict (unless not `targets`) and each failure; the exit status:
    1 if any failed."""
    for outcome in outcomes if targets else ():
        for line in verdicts(outcome):
            print(line.replace("**", ""))
    failed = [outcome for outcome in outcomes if not outcome.ok]
    for outcome in failed:
        print(f"benchmark {outcome.name} failed: {outcome.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
