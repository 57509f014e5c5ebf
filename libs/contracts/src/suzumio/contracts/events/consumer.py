"""Events about the platform's own consumers (poison messages parked aside)."""

from __future__ import annotations

from suzumio.contracts.envelope import DomainEvent, event


@event("consumer.message_parked")
class MessageParked(DomainEvent):
    """A message a consumer could not handle after its bounded redeliveries; acked and set aside.

    The aggregate id is the consumer's durable name, so `ev.consumer.<name>` lists everything a
    consumer gave up on, with enough to find the original (stream and sequence) and replay it.
    """

    stream: str
    stream_seq: int
    subject: str
    deliveries: int
    error: str
