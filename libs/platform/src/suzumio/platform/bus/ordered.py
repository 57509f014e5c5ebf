"""An ordered push consumer that starts at a given stream sequence, and stays there.

nats-py's ordered consumer recreates itself (a NATS restart, lost heartbeats, a consumer
lost with its server in a cluster) from the stream sequence after the last message it
delivered — counted from 0 until one came. Made with a start sequence and reset before its
first message, it replayed its subject from 1: for a client resuming a session's timeline
near its end, the whole log again as new items. `ordered_from` counts the messages before
the start as delivered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy


async def ordered_from(
    nc: NATS, subject: str, start: int, cb: Callable[[Msg], Awaitable[None]]
) -> Subscription:
    """An ordered consumer of `subject` from stream sequence `start` (at least 1) on."""
    start = max(start, 1)
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
    sub = await nc.jetstream().subscribe(subject, ordered_consumer=True, config=config, cb=cb)
    jsi = getattr(getattr(sub, "_sub", None), "_jsi", None)
    if jsi is not None:
        jsi._sseq = max(jsi._sseq, start - 1)
    return sub
