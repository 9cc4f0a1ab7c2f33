"""The other saga kinds trace as the upgrade does: a GPU remediation's (and a MIG
reconfiguration's) decisions and ended steps form one trace rooted at `<kind> saga` (its
first step), every command it issued parented on a step recorded in that trace; nothing is
recorded when tracing is off."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan

from gpuop.events.mig import MigState
from gpuop.events.remediation import RemediationState as R
from gpuop.saga.mig import kind as mig
from gpuop.saga.remediation import kind as remediation
from tests.support import mig_sagas
from tests.support.mig_runtime import reconfiguring
from tests.support.remediations import remediating
from tests.support.sagas import policy
from tests.support.spans import ancestry, one_tree, recorded_spans, untraced

NODE = "gpu-node-1"
ROOT = f"{remediation.NAME} saga"


def of_kind(spans: tuple[ReadableSpan, ...], name: str = remediation.NAME) -> list[ReadableSpan]:
    """The spans of the traces the kind's own spans are in (its Kubernetes actions'
    `kube <action>` spans too)."""
    traces = {
        s.context.trace_id for s in spans if (s.attributes or {}).get("gpuop.saga.kind") == name
    }
    return [s for s in spans if s.context.trace_id in traces]


async def test_a_remediation_is_one_trace_rooted_at_its_saga() -> None:
    with recorded_spans("upgrade-orchestrator") as exporter:
        async with remediating(policy()) as harness:
            await harness.fault(NODE)
            await harness.settle(until_ended=(NODE,))
            saga = await harness.saga(NODE)
            lines = await harness.export()
        found = exporter.get_finished_spans()

    assert saga is not None and saga.state is R.DONE, saga
    spans = of_kind(found)
    root = one_tree(spans)
    assert root.name == ROOT
    steps = [s.name for s in spans if s.name.startswith("step ")]
    assert "step reset" in steps and steps.count("step reset") == 1, steps
    decides = [s for s in spans if s.name.startswith("decide ")]
    assert decides and all(ancestry(s, spans)[-1] == ROOT for s in decides)
    assert any(s.name.startswith("kube ") for s in spans), "its Kubernetes actions are in it"
    assert any((s.attributes or {}).get("gpuop.saga.next_state") == str(R.DONE) for s in decides)
    # every command the remediation issued names a span of this trace as its parent
    ids = {f"{s.context.span_id:016x}" for s in spans}
    trace = f"{root.context.trace_id:032x}"
    parents = [
        line.split('"traceparent":"')[1].split('"')[0]
        for line in lines
        if '"GPUOP_COMMANDS"' in line and '"traceparent":"' in line
    ]
    assert parents, "the commands carry their step's trace context"
    assert all(p.split("-")[1] == trace and p.split("-")[2] in ids for p in parents), parents


async def test_nothing_is_recorded_when_tracing_is_off() -> None:
    with recorded_spans("upgrade-orchestrator") as exporter:
        with untraced():
            async with remediating(policy()) as harness:
                await harness.fault(NODE)
                await harness.settle(until_ended=(NODE,))
        assert of_kind(exporter.get_finished_spans()) == []


async def test_a_mig_reconfiguration_is_one_trace_rooted_at_its_saga() -> None:
    with recorded_spans("upgrade-orchestrator") as exporter:
        async with reconfiguring(mig_sagas.policy()) as harness:
            await harness.relabel(NODE, "half-balanced")
            await harness.started(NODE)
            await harness.settle(until_ended=(NODE,))
            saga = await harness.saga(NODE)
        found = exporter.get_finished_spans()

    assert saga is not None and saga.state is MigState.MIG_CONFIG_DONE, saga
    spans = of_kind(found, mig.NAME)
    assert one_tree(spans).name == f"{mig.NAME} saga"
    steps = [s.name for s in spans if s.name.startswith("step ")]
    assert len(steps) >= 4 and len(steps) == len(set(steps)), steps
