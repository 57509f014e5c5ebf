"""A durable pull consumer that acks only after its handler succeeded.

Messages come in batches; a handler that runs long keeps its message alive with `in_progress`
heartbeats; a failure is retried with backoff up to `max_deliver` deliveries, after which the
message is parked (an event records it) and terminated, so one poison message never blocks
the ones behind it.

`max_deliver` is this worker's count, not the server's: the consumer itself redelivers without
limit. JetStream never redelivers a message past its consumer's `max_deliver`, so one whose
parking failed on that last delivery (NATS briefly away for the handler and the parker alike)
would be gone without a trace; here it comes back until it is handled or parked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry.trace import SpanKind

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import MessageParked
from suzumio.platform import telemetry
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

MessageHandler = Callable[[Msg], Awaitable[None]]
Parker = Callable[[Msg, BaseException, int], Awaitable[None]]

_handled = telemetry.meter.create_counter(
    "suzumio_consumer_messages", description="messages handled by consumer and outcome"
)


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    max_deliver: int = 5
    ack_wait: float = 30.0
    batch: int = 64
    concurrency: int = 1
    backoff: tuple[float, ...] = (0.2, 1.0, 5.0, 15.0)
    max_ack_pending: int = 1_000
    deliver_new_only: bool = False

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=-1,  # see the module's docstring
            max_ack_pending=self.max_ack_pending,
            filter_subjects=list(self.filter_subjects),
            deliver_policy=DeliverPolicy.NEW if self.deliver_new_only else DeliverPolicy.ALL,
        )


def event_parker(store: EventStore, consumer: str) -> Parker:
    """Park by appending `consumer.message_parked` to `ev.consumer.<consumer>`."""

    async def park(msg: Msg, error: BaseException, deliveries: int) -> None:
        meta = msg.metadata
        parked = MessageParked(
            stream=meta.stream,
            stream_seq=meta.sequence.stream,
            subject=msg.subject,
            deliveries=deliveries,
            error=f"{type(error).__name__}: {error}"[:2_000],
        )
        await store.append_next(consumer, [parked], EventMeta(actor=f"system:{consumer}"))

    return park


class PullWorker:
    """Runs a handler over a durable pull consumer until stopped."""

    def __init__(
        self, nc: NATS, spec: ConsumerSpec, handler: MessageHandler, parker: Parker
    ) -> None:
        self._js = nc.jetstream()
        self.spec = spec
        self._handler = handler
        self._park = parker
        self._slots = asyncio.Semaphore(spec.concurrency)

    async def ensure_consumer(self) -> None:
        await self._js.add_consumer(self.spec.stream, self.spec.config())

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and handle until `stop` is set; the batch in hand is finished first."""
        await self.ensure_consumer()
        psub = await self._js.pull_subscribe_bind(self.spec.durable, stream=self.spec.stream)
        try:
            while not stop.is_set():
                try:
                    msgs = await psub.fetch(self.spec.batch, timeout=1.0)
                except (TimeoutError, NatsTimeoutError):
                    continue
                await asyncio.gather(*(self._guarded(m) for m in msgs))
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _guarded(self, msg: Msg) -> None:
        async with self._slots:
            await self.handle(msg)

    async def handle(self, msg: Msg) -> None:
        """Handle one message: ack on success, retry later on failure, park when spent."""
        beat = asyncio.create_task(self._heartbeat(msg))
        try:
            with telemetry.tracer.start_as_current_span(
                f"consume {self.spec.durable}",
                context=telemetry.extract(msg.headers),
                kind=SpanKind.CONSUMER,
            ):
                await self._handler(msg)
        except Exception as exc:
            await self._failed(msg, exc)
        else:
            await msg.ack()
            _handled.add(1, {"consumer": self.spec.durable, "outcome": "ok"})
        finally:
            beat.cancel()

    async def _failed(self, msg: Msg, exc: Exception) -> None:
        deliveries = msg.metadata.num_delivered
        seq = msg.metadata.sequence.stream
        if deliveries < self.spec.max_deliver:
            delay = self.spec.backoff[min(deliveries, len(self.spec.backoff)) - 1]
            log.warning(
                "consumer.retry",
                consumer=self.spec.durable,
                seq=seq,
                deliveries=deliveries,
                error=repr(exc),
            )
            await msg.nak(delay=delay)
            _handled.add(1, {"consumer": self.spec.durable, "outcome": "retry"})
            return
        try:
            await self._park(msg, exc, deliveries)
        except Exception:
            log.exception("consumer.park_failed", consumer=self.spec.durable, seq=seq)
            await msg.nak(delay=self.spec.backoff[-1])
            return
        log.error("consumer.parked", consumer=self.spec.durable, seq=seq, error=repr(exc))
        await msg.term()
        _handled.add(1, {"consumer": self.spec.durable, "outcome": "parked"})

    async def _heartbeat(self, msg: Msg) -> None:
        interval = max(self.spec.ack_wait / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            await msg.in_progress()
