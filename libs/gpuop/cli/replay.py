"""`gpuop replay FILE [--policy FILE]`: replay an exported log through a fresh decision core.

Reads the JSON lines of `gpuop events export`, replays them (`gpuop.saga.replaying`) and
compares the commands and state changes produced with the recorded ones, and the circuit
breaker's decisions (each recorded start and refusal) with the replayed breaker's. Exit 0 with one
summary line when they are identical; 1 with the first divergences per node (expected vs
got) when not, and 1 naming every line whose message travels on a subject its type and node do
not declare (forged or corrupt: nothing is replayed); 2 when the file or the policy cannot be
read (the message names the line).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import replaying


def add_parser(verbs: Any) -> None:
    replay: argparse.ArgumentParser = verbs.add_parser(
        "replay",
        help="replay an exported event log and compare the decisions",
        description="Feed the inbound events of FILE (from `gpuop events export`) to a fresh "
        "decision core with their recorded times; exit 0 when the commands and state changes "
        "it produces are the recorded ones, 1 with a diff when not.",
    )
    replay.add_argument("file", help="JSON lines from `gpuop events export`")
    replay.add_argument(
        "--policy",
        help="GPUClusterPolicy (or its spec), YAML or JSON, to decide with instead of the "
        "recorded policy",
    )
    replay.set_defaults(handler=replay_log)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def read_policy(path: str) -> GPUClusterPolicySpec:
    text = _read(path)
    try:
        document = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not JSON or YAML: {exc}") from None
    return replaying.load_policy(document, path)


async def replay_log(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    policy = read_policy(args.policy) if args.policy else None
    try:
        log = replaying.parse_log(_read(args.file).splitlines())
    except replaying.MisplacedMessages as exc:
        print(f"replay refused the log: {exc}")
        return 1
    replayed = replaying.replay(log, policy)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    if replayed.breaker_differs:
        _print_breaker(replayed)
        return 1
    if comparison.identical:
        print(replaying.summary(replayed, comparison))
        return 0
    print(f"replay diverged on {len(comparison.divergences)} nodes:")
    print(comparison.report())
    return 1


def _print_breaker(replayed: replaying.Replayed) -> None:
    sections = (
        ("would have refused remediations the log started", replayed.refused),
        ("would have started remediations the log refused", replayed.allowed),
        ("refuses remediations whose refusal the log does not record", replayed.unrecorded),
    )
    for heading, lines in sections:
        if lines:
            print(f"the circuit breaker {heading}:")
            print("\n".join(f"  {line}" for line in lines))
