"""Instants carried in event payloads (`not_before`, `expires_at`), as a timestamptz takes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

# asyncpg writes the very first and last `datetime` as -infinity and infinity, and reads those
# back without a timezone (then comparing them with an aware clock raises, and the API gives
# them out naive): the range kept is one microsecond inside. The API takes up to
# 9999-12-31T23:59:59.999999Z (`values.LATEST`), which would otherwise be that last one.
_LATEST = datetime.max.replace(tzinfo=UTC) - timedelta(microseconds=1)
_EARLIEST = datetime.min.replace(tzinfo=UTC) + timedelta(microseconds=1)


def instant(value: datetime | None) -> datetime | None:
    """`value` in UTC, within what the read models can hold and give back.

    Without a timezone (written before the API refused that) it is UTC, as the scheduler
    reads it: the driver would take the projector host's local time, and a rebuild on another
    host would differ. One that leaves the years 1..9999 on the way to UTC
    (9999-12-31T23:00-05:00) is the latest (or earliest) instant kept, which means the same
    for a deadline: the driver's conversion would fail and the event be parked, its row
    missing from the read model."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        return _LATEST if value.year > 1 else _EARLIEST
    return min(max(utc, _EARLIEST), _LATEST)
