"""KV watches and key listings (`kv.NatsKeyValue.watch`, `keys`) as ordered consumers whose
filter a NATS permission can bind, and which tell from their creation how much there is to
catch up on.

nats-py creates an ordered consumer on `$JS.API.CONSUMER.CREATE.<stream>`, with the filter
in the request's body, where no permission can see it: whoever may watch one key of a bucket
could watch every key. A consumer with a name is created on
`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>` instead, and nats-server (2.10 on) takes a
name without a durable name as an ephemeral consumer, so each watch gets a fresh random name
and the grants (`gpuop.bus.grants`) allow the create only with the filters a user may read:
the network-manager of gpu-1 watches `$KV.<ipam>.node.gpu-1.>`, never gpu-2's records.

The server answers the create with the consumer's info as it was made: how many messages it
has to deliver (`num_pending`) and nothing delivered yet. A watch decides from that answer
whether its initial listing is empty, so no user needs `$JS.API.CONSUMER.INFO` on a bucket,
which, since a watch's name is random, could only be granted for every consumer of the
bucket and would show any other watch's filter. nats-py's `js.subscribe` drops that answer,
so the consumer is created here (`add_consumer`, with the config `js.subscribe` would send)
and the subscription bound to it (`subscribe_bind`).

The consumer is nats-py's ordered consumer otherwise (flow control, heartbeats, no acks, in
memory, recreated from the next stream sequence when a delivery goes missing). That
recreation reuses the first consumer's request, so every recreation gets a name of its own:
the old consumer may still exist (it lives until its inactivity threshold), and a create
under its name with another start would be refused as an update.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

NAME_PREFIX = "gpuop-watch-"
"""How a watch's consumer is named: the prefix and 16 random hex digits."""

IDLE_HEARTBEAT = 5.0
"""Seconds between the server's heartbeats to an idle watch (nats-py's default): two missed
make the watch recreate its consumer."""


class Ordered(NamedTuple):
    subscription: JetStreamContext.PushSubscription
    created: ConsumerInfo
    """The server's answer to the create: `num_pending` is what the consumer had to deliver
    when it was made, before any delivery."""


def consumer_name() -> str:
    return NAME_PREFIX + secrets.token_hex(8)


def ordered_config(
    subject: str,
    deliver_subject: str,
    *,
    deliver_policy: DeliverPolicy | None = None,
    headers_only: bool | None = None,
    inactive_threshold: float | None = None,
) -> ConsumerConfig:
    """What nats-py's `js.subscribe(..., ordered_consumer=True)` asks for, under a fresh
    name."""
    return ConsumerConfig(
        name=consumer_name(),
        deliver_subject=deliver_subject,
        filter_subject=subject,
        deliver_policy=deliver_policy or DeliverPolicy.ALL,
        headers_only=headers_only,
        inactive_threshold=inactive_threshold,
        flow_control=True,
        ack_policy=AckPolicy.NONE,
        max_deliver=1,
        ack_wait=22 * 3600,
        idle_heartbeat=IDLE_HEARTBEAT,
        num_replicas=1,
        mem_storage=True,
    )


async def named_ordered(
    js: JetStreamContext,
    subject: str,
    *,
    stream: str,
    deliver: str,
    cb: Callable[[Msg], Awaitable[None]] | None = None,
    deliver_policy: DeliverPolicy | None = None,
    headers_only: bool | None = None,
    inactive_threshold: float | None = None,
) -> Ordered:
    """An ordered push consumer of `stream` filtered on `subject`, created with its filter in
    the API subject, delivering to `deliver` (a fresh inbox of the connection), and the
    server's answer to its creation."""
    config = ordered_config(
        subject,
        deliver,
        deliver_policy=deliver_policy,
        headers_only=headers_only,
        inactive_threshold=inactive_threshold,
    )
    # created before anyone listens on `deliver`, as by nats-py's `subscribe`: the server
    # sends a push consumer nothing until then
    created = await js.add_consumer(stream, config=config)
    subscription = await js.subscribe_bind(
        stream, config, created.name, cb=cb, ordered_consumer=True
    )
    _rename_on_recreate(subscription)
    return Ordered(subscription, created)


def _rename_on_recreate(subscription: JetStreamContext.PushSubscription) -> None:
    # nats-py keeps an ordered consumer's state on its core subscription (`_jsi`), whose
    # `recreate_consumer` sends the first request again with a new start: give it a new name
    # first. A nats-py without that state is one this code was not written for: fail loudly
    # rather than recreate under a taken name.
    state: Any = getattr(subscription._sub, "_jsi", None)
    if state is None or not hasattr(state, "recreate_consumer") or state._ccreq is None:
        raise RuntimeError("nats-py's ordered consumer keeps no recreate state: check its version")
    recreate = state.recreate_consumer

    async def recreate_renamed() -> None:
        state._ccreq.name = consumer_name()
        await recreate()

    state.recreate_consumer = recreate_renamed
