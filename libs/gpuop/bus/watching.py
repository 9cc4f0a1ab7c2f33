"""KV watches and key listings (`kv.KvBucket.watch`, `keys`) as ordered consumers whose
filter a NATS permission can bind.

nats-py creates an ordered consumer on `$JS.API.CONSUMER.CREATE.<stream>`, with the filter
in the request's body, where no permission can see it: whoever may watch one key of a bucket
could watch every key. A consumer with a name is created on
`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>` instead, and nats-server (2.10 on) takes a
name without a durable name as an ephemeral consumer, so each watch gets a fresh random name
and the grants (`gpuop.bus.grants`) allow the create only with the filters a user may read:
the network-manager of gpu-1 watches `$KV.<ipam>.node.gpu-1.>`, never gpu-2's records.

The consumer is nats-py's ordered consumer otherwise (flow control, heartbeats, no acks, in
memory, recreated from the next stream sequence when a delivery goes missing). That
recreation reuses the first consumer's request, so `named_ordered` gives every recreation a
name of its own: the old consumer may still exist (it lives until its inactivity threshold),
and a create under its name with another start would be refused as an update.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

NAME_PREFIX = "gpuop-watch-"
"""How a watch's consumer is named: the prefix and 16 random hex digits."""


def consumer_name() -> str:
    return NAME_PREFIX + secrets.token_hex(8)


async def named_ordered(
    js: JetStreamContext,
    subject: str,
    *,
    stream: str,
    cb: Callable[[Msg], Awaitable[None]] | None = None,
    deliver_policy: DeliverPolicy | None = None,
    headers_only: bool | None = None,
    inactive_threshold: float | None = None,
) -> JetStreamContext.PushSubscription:
    """An ordered push consumer of `stream` filtered on `subject`, created with its filter in
    the API subject."""
    subscription = await js.subscribe(
        subject,
        stream=stream,
        cb=cb,
        config=ConsumerConfig(name=consumer_name()),
        ordered_consumer=True,
        deliver_policy=deliver_policy,
        headers_only=headers_only,
        inactive_threshold=inactive_threshold,
    )
    _rename_on_recreate(subscription)
    return subscription


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
