"""The follower's reading of a message it fetched itself (after a gap) by Direct Get."""

from __future__ import annotations

from datetime import UTC, datetime

from suzumio.platform.bus.direct_get import StoredMessage
from suzumio.platform.bus.follower import _from_stored


def test_a_message_read_by_direct_get_keeps_the_servers_time_and_headers() -> None:
    stored = StoredMessage(
        seq=42,
        subject="ev.project.x",
        headers={
            "Nats-Time-Stamp": "2026-03-04T05:06:07.123456789Z",
            "Suzumio-Type": "project.created,project.renamed",
            "Suzumio-Version": "3",
        },
        data=b"[]",
    )
    msg = _from_stored(stored, pending=7)
    assert msg.stored_at == datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    assert (msg.seq, msg.subject, msg.version, msg.pending) == (42, "ev.project.x", 3, 7)
    assert msg.types == ("project.created", "project.renamed")


def test_a_whole_second_stamp_is_read_too() -> None:
    stored = StoredMessage(1, "ev.a.b", {"Nats-Time-Stamp": "2026-03-04T05:06:07Z"}, b"{}")
    assert _from_stored(stored, 0).stored_at == datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
