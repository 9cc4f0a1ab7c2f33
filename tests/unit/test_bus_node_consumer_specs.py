"""`grants.node_consumer_spec`: a node agent consumes with the consumer its grants declare,
so the services cannot drift from the table (name, filter, where it starts)."""

from __future__ import annotations

import pytest

from gpuop.bus import grants

NODE = "gpu-1.example.com"


@pytest.mark.parametrize(
    ("role", "purpose", "new_only"),
    [
        ("discovery", "commands", False),
        ("discovery", "rescan", True),
        ("network-manager", "driver-events", True),
        ("telemetry", "commands", False),
    ],
)
def test_a_node_consumer_spec_is_the_granted_consumer(
    role: str, purpose: str, new_only: bool
) -> None:
    spec = grants.node_consumer_spec(role, NODE, purpose, prefix="gpuop", retry_delay=2.5)

    granted = grants.consumer(grants.Identity(role, NODE), purpose, prefix="gpuop")
    assert (spec.durable, tuple(spec.subjects)) == (granted.durable, granted.filters)
    assert spec.deliver_new_only is new_only
    assert spec.retry_delay == 2.5


def test_a_purpose_the_grants_do_not_declare_has_no_spec() -> None:
    with pytest.raises(ValueError, match="telemetry has no consumer for 'rescan'"):
        grants.node_consumer_spec("telemetry", NODE, "rescan", prefix="gpuop", retry_delay=1)
