"""A durable pull consumer that acks only after its handler succeeded.

Messages come in batches; a handler that runs long keeps its message alive with `in_progress`
heartbeats; a failure is retried with backoff up to `max_deliver` deliveries, after which the
message is parked (an event records it) and terminated, so one poison message never blocks
the ones behind it.

`max_deliver` is this worker's count, not the server's: the consumer itself redelivers without
limit. JetStream never redelivers a message past its consumer's `max_deliver`, so one whose
parking failed on that last delivery (NATS briefly away for the handler and the parker alike)
would be gone without a trace; here it comes back until it is handled or parked.

A NATS outage (the server restarting, the client reconnecting) is ridden out, not a crash: a
failed fetch is logged and retried with backoff (making the consumer again, idempotently, in
case the server lost it), and an ack, nak or term that could not be sent is logged and left to
redelivery — nothing is lost, a handler runs at least once anyway. Only `stop` ends `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats import errors as nats_errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError
from opentelemetry.trace import SpanKind

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import MessageParked
from suzumio.platform import telemetry
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

MessageHandler = Callable[[Msg], Awaitable[None]]
Parker = Callable[[Msg, BaseException, int], Awaitable[None]]

# What a NATS outage raises from a fetch, an ack or a consumer's creation: the client's errors
# (closed, reconnecting with a full buffer, no responders, a JetStream API error while the
# server recovers its streams) and the socket's own.
_OUTAGE = (nats_errors.Error, OSError)
_RETRY_MAX_SECONDS = 5.0

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
        """Fetch and handle until `stop` is set; the batch in hand is finished first. NATS
        away (at start or later) is waited out with backoff."""
        delay = 0.2
        while True:
            try:
                await self.ensure_consumer()
                psub = await self._js.pull_subscribe_bind(
                    self.spec.durable, stream=self.spec.stream
                )
                break
            except BadRequestError:  # the consumer's config refused: not an outage
                raise
            except _OUTAGE as exc:
                delay = await self._back_off(stop, "consumer.setup_failed", exc, delay)
                if stop.is_set():
                    return
        try:
            delay, lost = 0.2, False
            while not stop.is_set():
                try:
                    if lost:  # the server may have come back without it: made again, same config
                        await self.ensure_consumer()
                        lost = False
                    # No more than it handles at once: one handler stuck (a call with no
                    # timeout) kept the rest of a larger batch alive, held from every other
                    # replica for as long as it hung.
                    msgs = await psub.fetch(
                        max(1, min(self.spec.batch, self.spec.concurrency)), timeout=1.0
                    )
                except (TimeoutError, NatsTimeoutError):
                    continue
                except BadRequestError:  # the consumer's config refused: not an outage
                    raise
                except _OUTAGE as exc:
                    delay = await self._back_off(stop, "consumer.fetch_failed", exc, delay)
                    lost = True
                    continue
                delay = 0.2
                await asyncio.gather(*(self._guarded(m) for m in msgs))
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _back_off(
        self, stop: asyncio.Event, event: str, exc: BaseException, delay: float
    ) -> float:
        """Log, wait `delay` (or until stopped); the next delay."""
        log.warning(event, consumer=self.spec.durable, error=repr(exc), retry_in=delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        return min(delay * 2, _RETRY_MAX_SECONDS)

    async def _guarded(self, msg: Msg) -> None:
        # Kept alive from the fetch on, not from its slot: the batch's others wait their turn
        # meanwhile, and past `ack_wait` (slow handlers, in an outage) the server handed them
        # to another replica too, counting deliveries never tried — parked after one try.
        beat = asyncio.create_task(self._heartbeat(msg))
        try:
            async with self._slots:
                await self.handle(msg, beating=True)
        finally:
            beat.cancel()

    async def handle(self, msg: Msg, *, beating: bool = False) -> None:
        """Handle one message: ack on success, retry later on failure, park when spent.
        `beating`: its caller keeps it alive (`in_progress`) already."""
        beat = asyncio.create_task(self._heartbeat(msg)) if not beating else None
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
            if await self._settle(msg, "ack", msg.ack()):
                _handled.add(1, {"consumer": self.spec.durable, "outcome": "ok"})
        finally:
            if beat is not None:
                beat.cancel()

    async def _settle(self, msg: Msg, what: str, call: Awaitable[None]) -> bool:
        """Send an ack/nak/term; one NATS could not take is logged, not raised: the message
        comes back after `ack_wait` (its handler runs again, which it must bear anyway)."""
        try:
            await call
        except _OUTAGE as exc:
            log.warning(
                "consumer.settle_failed",
                consumer=self.spec.durable,
                seq=msg.metadata.sequence.stream,
                what=what,
                error=repr(exc),
            )
            return False
        return True

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
            if await self._settle(msg, "nak", msg.nak(delay=delay)):
                _handled.add(1, {"consumer": self.spec.durable, "outcome": "retry"})
            return
        try:
            await self._park(msg, exc, deliveries)
        except Exception:
            log.exception("consumer.park_failed", consumer=self.spec.durable, seq=seq)
            await self._settle(msg, "nak", msg.nak(delay=self.spec.backoff[-1]))
            return
        log.error("consumer.parked", consumer=self.spec.durable, seq=seq, error=repr(exc))
        # A term that is lost parks it again on its next delivery: twice recorded, never lost.
        if await self._settle(msg, "term", msg.term()):
            _handled.add(1, {"consumer": self.spec.durable, "outcome": "parked"})

    async def _heartbeat(self, msg: Msg) -> None:
        interval = max(self.spec.ack_wait / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            # A beat lost to an outage is not the end of the beating: the next one may land.
            with contextlib.suppress(*_OUTAGE):
                await msg.in_progress()
