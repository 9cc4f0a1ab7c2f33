"""`gpuop upgrade start|status|pause|resume|abort|plan`: operate a rolling driver upgrade.

Rollout control is declarative: start, pause, resume and abort edit the GPUClusterPolicy
(`gpuop.cli.controls` says how), and the leader of the upgrade orchestrators acts on it, so
every replica and `gpuop replay` see the same. `status` and `plan` only read: Kubernetes (the
policy, its status, the nodes' `gpuop.io/driver-upgrade-state` labels) unless only `--nats`
is given, and the event log as well when `--nats` is given (`gpuop.cli.snapshots`); `plan`
forecasts the waves and the makespan with `gpuop.cli.planning`.

Every action takes `--kubeconfig`, `--context`, `--policy` and `--json`; `status` and `plan`
take `--nats`, `--nats-creds` and `--prefix` too. Exit codes are `gpuop.cli.errors`': 0 done,
1 the operation failed (the message says why), 2 bad usage or input (naming the flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gpuop.cli import controls, coverage, matrix, offering, planning, reports, snapshots
from gpuop.cli.errors import CommandFailed
from gpuop.cli.events import nats_bus, nats_prefix
from gpuop.cli.verbs import add_command
from gpuop.events.driver import Component
from gpuop.kube import client as kubeclient
from gpuop.kube import errors as kubeerrors
from gpuop.policy import GPUClusterPolicySpec, flavours, selectors
from gpuop.policy.drivers import DEFAULT_POOL, DriverSource, DriverVersion
from gpuop.saga.upgrade.records import desired_targets

REQUEST_TIMEOUT = 10.0
"""Seconds one API request of the CLI may take."""

_NOT_UNDER_WAY = (reports.S.UPGRADE_REQUIRED, reports.S.UPGRADE_DONE, reports.S.UPGRADE_FAILED)
"""Label states of nodes not in a maintenance window."""
_VERSION: TypeAdapter[str] = TypeAdapter(DriverVersion)
_SOURCE: TypeAdapter[str] = TypeAdapter(DriverSource)

START_HELP = """\
Ask for a new driver version: sets spec.driver.<component>.version (and --source,
maxParallelUpgrades from --max-parallel, upgradePolicy.nodeSelector from --selector) and
clears upgradePolicy.paused. The upgrade orchestrator then rolls it across the selected
GPU nodes. The versions it replaced are remembered for `gpuop upgrade abort`.
Before the policy is edited, the driver source's index (--source, else the policy's) is read
and a version it does not offer is refused (exit 1), naming the versions it has; a source
this machine cannot reach is not checked (a note says so). So is the fleet's matrix: every
node the new version would upgrade needs a package for its kernel, architecture and kernel
modules; the missing ones are refused (exit 1), each named with the `gpuop package build`
command that makes it (`gpuop package plan` lists them beforehand). Each node fetches and checks the
package again before it is cordoned, so a node its source cannot serve fails uncordoned."""
PAUSE_HELP = """\
Pause the rollout (upgradePolicy.paused: true): no further node is admitted; nodes already
under way (cordoned, draining, reloading) finish their upgrade. The Progressing condition
says RolloutPaused. `gpuop upgrade resume` carries on."""
RESUME_HELP = "Resume a paused rollout (upgradePolicy.paused: false)."
ABORT_HELP = """\
Abort the rollout the last `gpuop upgrade start` began, as `kubectl rollout undo` would:
the policy asks for the versions it replaced again (and is no longer paused). Nodes not yet
upgraded are left alone; nodes already upgraded are rolled back to those versions, under
the same maxParallelUpgrades and maxUnavailable; a node in the middle of its upgrade
finishes it first (its driver is never left half-installed), then is rolled back. To stop
without rolling anything back, use `gpuop upgrade pause`. Fails (exit 1) when the policy's
versions were not set by `gpuop upgrade start`, or were aborted already."""
STATUS_HELP = """\
Show the rollout: the policy (versions, limits, paused, conditions) and one row per GPU
node (state, driver, attempt, reason; a node admission leaves out says why it is skipped).
Reads Kubernetes unless --nats is given without a kubeconfig (flag, GPUOP_KUBECONFIG or
KUBECONFIG); with --nats it also reads the latest upgrade events (attempt and reason of each
state, the rollout's progress)."""
PLAN_HELP = """\
Dry run: predict the waves in which the nodes will be admitted and the makespan, from the
policy (maxParallelUpgrades, maxUnavailable, canary, nodeSelector) and the nodes' states.
Each state's duration is measured from past rollouts in the event log when --nats is given,
and a typical value otherwise. Refuses (exit 1) a rollout whose driver source has no package
for some node's kernel, naming the nodes and kernels. Changes nothing."""


def add_parser(verbs: Any) -> None:
    actions = add_command(
        verbs,
        "upgrade",
        help="start, watch, pause, resume, abort or plan a rolling driver upgrade",
        description="Operate the rolling driver upgrade through the GPUClusterPolicy.",
    )
    kube, nats = kube_flags(), nats_flags()

    def action(
        name: str, short: str, text: str, handler: Any, *parents: argparse.ArgumentParser
    ) -> Any:
        sub = actions.add_parser(name, help=short, description=text, parents=[kube, *parents])
        sub.set_defaults(handler=handler)
        return sub

    start = action("start", "ask for a new driver version", START_HELP, start_rollout)
    start.add_argument("--version", required=True, help="driver version, e.g. 580.105.08")
    start.add_argument(
        "--component", choices=[str(c) for c in Component], default="gpu", help="default gpu"
    )
    start.add_argument("--source", help="driver source: a directory, file:// or http(s) URL")
    start.add_argument("--max-parallel", type=int, help="maxParallelUpgrades (0: no limit)")
    start.add_argument(
        "--selector", help="upgradePolicy.nodeSelector, e.g. pool=training ('' selects all)"
    )
    action("status", "show the rollout, node by node", STATUS_HELP, show_status, nats)
    action("pause", "admit no further node", PAUSE_HELP, pause_rollout)
    action("resume", "admit nodes again", RESUME_HELP, resume_rollout)
    action("abort", "undo the last start: back to the previous versions", ABORT_HELP, abort_rollout)
    action("plan", "predict the waves and the makespan (dry run)", PLAN_HELP, plan_rollout, nats)


def kube_flags(*, with_json: bool = True) -> argparse.ArgumentParser:
    """How a command finds the cluster and its policy (`--kubeconfig`, `--context`,
    `--policy`, `--pool`; `--json` unless told not to), for `parents=`."""
    kube = argparse.ArgumentParser(add_help=False)
    kube.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: GPUOP_KUBECONFIG, KUBECONFIG, ~/.kube/config, "
        "else the pod's service account)",
    )
    kube.add_argument("--context", help="kubeconfig context (default: its current one)")
    kube.add_argument(
        "--policy", help="GPUClusterPolicy name (default: the one gpuop follows, first by name)"
    )
    if with_json:
        kube.add_argument("--json", action="store_true", help="print one JSON object")
    kube.add_argument(
        "--pool",
        help="act on one driver pool (spec.driver.pools[].name); status and plan show its nodes",
    )
    return kube


def nats_flags() -> argparse.ArgumentParser:
    """How a command reads the event log (`--nats`, `--nats-creds`, `--prefix`)."""
    nats = argparse.ArgumentParser(add_help=False)
    nats.add_argument("--nats", help="NATS URLs, comma separated (GPUOP_NATS)")
    nats.add_argument("--nats-creds", help="NATS credentials file (GPUOP_NATS_CREDS)")
    nats.add_argument("--prefix", help="subject prefix (GPUOP_PREFIX, default gpuop)")
    return nats


def kubeconfig_path(args: argparse.Namespace, environ: Mapping[str, str]) -> Path | None:
    """The kubeconfig to use, as kubectl finds one; None: the in-cluster service account."""
    given = args.kubeconfig or environ.get("GPUOP_KUBECONFIG")
    if given:
        return Path(given)
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return Path(listed[0])
    default = Path(environ.get("HOME", "~")).expanduser() / ".kube" / "config"
    return default if default.is_file() else None


@asynccontextmanager
async def connected(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> AsyncIterator[kubeclient.Kube]:
    """The API server; an unreachable one fails the command with where it was looked for."""
    path = kubeconfig_path(args, environ)
    if path is not None and not path.is_file():
        raise ValueError(f"--kubeconfig {path}: no such file")
    try:
        kube = await kubeclient.connect(path, context=args.context, request_timeout=REQUEST_TIMEOUT)
    except kubeerrors.ConfigError as error:
        if path is None:
            raise ValueError("no kubeconfig found: pass --kubeconfig FILE") from None
        raise ValueError(f"--kubeconfig {path}: {error}") from None
    try:
        yield kube
    except kubeerrors.Unreachable as error:
        host = kube.api_client.configuration.host
        raise CommandFailed(f"cannot reach the Kubernetes API server at {host}: {error}") from None
    finally:
        await kube.close()


def _print(args: argparse.Namespace, document: Mapping[str, Any], lines: list[str]) -> None:
    print(json.dumps(document, sort_keys=False) if args.json else "\n".join(lines), flush=True)


async def _edit(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    build: Callable[[snapshots.PolicyView], controls.Edit],
) -> int:
    async with connected(args, environ) as kube:
        policy, edit = await controls.apply(kube, args.policy, build)
        snapshot = await snapshots.read_kube(kube, policy.name)
    selected = [view.name for view in snapshot.nodes.values() if view.selected]
    under_way = [
        v.name for v in reports.managed(snapshot) if v.state not in (None, *_NOT_UNDER_WAY)
    ]
    document = {
        "policy": policy.name,
        "action": edit.action,
        "changed": bool(edit.patch),
        "summary": edit.summary,
        "policyNow": reports.status_document(snapshot)["policy"],
        "selectedNodes": len(selected),
        "underWay": under_way,
    }
    lines = [f"GPUClusterPolicy {policy.name}: {edit.summary}"]
    if snapshot.policy is not None and snapshot.policy.spec is not None:
        upgrade = snapshot.policy.spec.upgrade_policy
        total = len(snapshot.nodes)
        chosen = (
            f"{len(selected)} of {total} GPU nodes ({upgrade.node_selector})"
            if upgrade.node_selector
            else f"all {total} GPU nodes"
        )
        lines.append(
            f"  {controls.versions(snapshot.policy.spec)}; maxParallelUpgrades "
            f"{upgrade.max_parallel_upgrades}, maxUnavailable {upgrade.max_unavailable}; "
            f"nodes: {chosen}"
        )
    if under_way:
        lines.append(f"  under way: {', '.join(under_way)}")
    lines.append("  follow it with: gpuop upgrade status")
    _print(args, document, lines)
    return 0


async def start_rollout(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    version = _checked(_VERSION, args.version, "--version")
    source = _checked(_SOURCE, args.source, "--source") if args.source is not None else None
    if args.max_parallel is not None and args.max_parallel < 0:
        raise ValueError(f"--max-parallel {args.max_parallel}: expected 0 (no limit) or more")
    if args.selector is not None and not selectors.is_valid(args.selector):
        raise ValueError(
            f"--selector {args.selector!r}: not a label selector (e.g. pool=training,zone!=a)"
        )
    component = Component(args.component)

    def build(policy: snapshots.PolicyView) -> controls.Edit:
        return controls.start(
            policy,
            component,
            version,
            source=source,
            max_parallel=args.max_parallel,
            selector=args.selector,
            pool=args.pool,
        )

    # the version must be in the source's index before the policy asks for it: a version
    # no source has would fail every node of the rollout (issue 18)
    async with connected(args, environ) as kube:
        policy = snapshots.policy_view(await snapshots.find_policy(kube, args.policy))
        fleet = await snapshots.read_kube(kube, policy.name)
    after = controls.spec_after(policy, build(policy))
    # and in the kernel modules the policy asks for; `auto` picks per node from its GPUs,
    # which start does not read: the node-independent rule, and a note instead of a refusal
    gpu, _ = after.driver.components_of(args.pool)
    modules = flavours.resolve(gpu.kernel_module_type, None, gpu.version)
    targets = desired_targets(after, args.pool, modules.flavour)
    if component in targets:
        note = await offering.require(
            component,
            targets[component],
            flavour_decided=gpu.kernel_module_type != "auto",
            module_parameters=gpu.kernel_module_parameters if component is Component.GPU else None,
        )
        if note is not None:
            print(f"gpuop upgrade start: {note}", file=sys.stderr, flush=True)
    await _require_matrix(in_pool(matrix.selected_by(fleet, after), args.pool), after)
    return await _edit(args, environ, build)


async def _require_matrix(fleet: snapshots.Snapshot, after: GPUClusterPolicySpec) -> None:
    """`CommandFailed` unless the sources have a package for every node `after` would
    upgrade (its kernel, architecture and kernel modules: `gpuop.cli.matrix`), naming the
    missing packages and the command that builds each; a source not reachable from here was
    noted by `offering.require` already."""
    checked = await coverage.check(matrix.wanted(fleet, after, decided_only=True))
    missing = matrix.lacking(checked, fleet)
    if missing:
        raise CommandFailed(
            f"the driver sources lack {len(missing)} package(s) the nodes need; "
            f"{offering.UNCHANGED}. Build them (gpuop package build --missing does it all):\n  "
            + "\n  ".join(matrix.describe(missing))
        )


async def pause_rollout(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    return await _edit(args, environ, lambda policy: controls.pause(policy, True, args.pool))


async def resume_rollout(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    return await _edit(args, environ, lambda policy: controls.pause(policy, False, args.pool))


async def abort_rollout(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    return await _edit(args, environ, lambda policy: controls.abort(policy, args.pool))


def _checked(adapter: TypeAdapter[str], value: str, flag: str) -> str:
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        message = error.errors()[0]["msg"]
        raise ValueError(f"{flag} {value!r}: {message}") from None


async def read(args: argparse.Namespace, environ: Mapping[str, str]) -> snapshots.Snapshot:
    """Kubernetes unless --nats is given and no kubeconfig is (by flag or environment); the
    event log too when --nats (or GPUOP_NATS) is."""
    use_nats = bool(args.nats or environ.get("GPUOP_NATS"))
    named = args.kubeconfig or environ.get("GPUOP_KUBECONFIG") or environ.get("KUBECONFIG")
    use_kube = bool(named) or not args.nats
    kube_view = log_view = None
    if use_kube:
        async with connected(args, environ) as kube:
            kube_view = await snapshots.read_kube(kube, args.policy)
    if use_nats:
        bus = nats_bus(args, environ, nats_prefix(args, environ))
        await bus.connect()
        try:
            log_view = await snapshots.read_events(bus)
        finally:
            await bus.close()
    if kube_view is not None and log_view is not None:
        return in_pool(snapshots.merge(kube_view, log_view), args.pool)
    found = kube_view or log_view
    assert found is not None
    return in_pool(found, args.pool)


def in_pool(snapshot: snapshots.Snapshot, pool: str | None) -> snapshots.Snapshot:
    """The snapshot narrowed to the nodes of `pool` (`default`: those of no pool); None:
    every node. A pool the policy lacks is a usage error."""
    if pool is None:
        return snapshot
    spec = snapshot.policy.spec if snapshot.policy else None
    names = [p.name for p in spec.driver.pools] if spec is not None else []
    if pool != DEFAULT_POOL and pool not in names:
        raise ValueError(
            f"--pool {pool}: no such driver pool (pools: {', '.join(names) or 'none'})"
        )
    wanted = None if pool == DEFAULT_POOL else pool
    kept = {n: v for n, v in snapshot.nodes.items() if reports.pool_of(v, spec) == wanted}
    return dataclasses.replace(snapshot, nodes=kept)


async def show_status(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    snapshot = await read(args, environ)
    _print(args, reports.status_document(snapshot), reports.status_lines(snapshot))
    return 0


async def plan_rollout(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    snapshot = await read(args, environ)
    policy = snapshot.policy
    if policy is None or policy.spec is None:
        why = policy.invalid if policy else "the event log holds no PolicyApplied"
        raise CommandFailed(f"no valid GPUClusterPolicy to plan with: {why}")
    spec = policy.spec
    checked = await coverage.check(matrix.wanted(snapshot, spec))
    if checked.blocking:
        raise CommandFailed(
            "refusing the rollout: it would drain nodes whose kernel the driver source has no "
            "package for, to fail them at the install\n  " + "\n  ".join(checked.describe())
        )
    spent = planning.durations(spec, planning.measure(snapshot.changes))
    nodes = {
        view.name: planning.PlanNode(
            status=reports.node_status(view),
            state=reports.state_of(view, spec),
            needs_upgrade=reports.state_of(view, spec) is not reports.S.UPGRADE_DONE,
        )
        for view in reports.managed(snapshot)
    }
    forecast = planning.forecast(nodes, spec, spent)
    document = reports.plan_document(snapshot, spec, spent, forecast)
    document["packages"] = checked.document()
    lines = reports.plan_lines(document)
    lines += [f"  {why}" for why in checked.unchecked.values()]
    if checked.unknown_kernels:
        lines.append(f"  kernel not known, not checked: {', '.join(checked.unknown_kernels)}")
    _print(args, document, lines)
    return 0
