"""Recording the events a projection gave up on, as `consumer.message_parked` events."""

from __future__ import annotations

from collections.abc import Sequence

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import MessageParked
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.logging import get_logger
from suzumio.platform.projections.apply import Parked

log = get_logger(__name__)


async def record_parked(
    store: EventStore,
    parked: Sequence[Parked],
    *,
    consumer: str,
    attempts: int,
    strict: bool = False,
) -> None:
    """Append one record per parked event to `ev.consumer.<consumer>-<projection>`.

    `strict`: a record that cannot be appended raises (the live projector records before it
    commits the skip, so a skip is never without its record). Otherwise best effort after the
    fact: the projection already moved past the event; a failure to record it is logged.
    """
    for p in parked:
        log.error("projection.parked_event", projection=p.projection, seq=p.seq, type=p.type,
                  error=p.error, consumer=consumer)  # fmt: skip
        event = MessageParked(
            stream=store.topology.events_stream,
            stream_seq=p.seq,
            subject=p.subject,
            deliveries=attempts,
            error=f"{p.projection}: {p.error}"[:2_000],
        )
        try:
            await store.append_next(
                f"{consumer}-{p.projection}", [event], EventMeta(actor=f"system:{consumer}")
            )
        except Exception:
            log.exception("projection.park_record_failed", seq=p.seq)
            if strict:
                raise
