"""Reading stored messages by subject with JetStream's Direct Get (streams allow_direct), over
the connection's one reply subscription (`Replies`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.platform.bus.jsapi import API_PREFIX
from suzumio.platform.bus.replies import Replies
from suzumio.platform.errors import PlatformError

# What one round trip of `iter_subject` brings at most, and the message that passes it.
BATCH_BYTES = 16 * 1024 * 1024


class DirectGetError(PlatformError):
    """A Direct Get answered with an error status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"direct get failed with status {status}")
        self.status = status

    @property
    def passes(self) -> bool:
        """Trouble that passes: a replica behind the floor asked for (412), the server's own
        (5xx: no leader while a cluster elects one), a timeout; else a request the server
        refused (a bug)."""
        return self.status in {408, 412, 429} or self.status >= 500


@dataclass(frozen=True, slots=True)
class StoredMessage:
    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes


def _stored(msg: Msg) -> StoredMessage | None:
    headers = msg.headers or {}
    status = headers.get("Status")
    if status in {"404", "204"}:
        return None
    if status:
        raise DirectGetError(int(status) if status.isdigit() else 0)
    return StoredMessage(
        seq=int(headers["Nats-Sequence"]),
        subject=headers["Nats-Subject"],
        headers=dict(headers),
        data=msg.data,
    )


async def last_for_subject(
    nc: NATS, stream: str, subject: str, *, timeout: float = 5.0, min_last_seq: int = 0
) -> StoredMessage | None:
    """The newest message stored on `subject`, or None when there is none; `min_last_seq`:
    from a replica holding the stream up to there (see `iter_subject`)."""
    if min_last_seq:
        body = json.dumps({"last_by_subj": subject, "min_last_seq": min_last_seq}).encode()
        request = f"{API_PREFIX}.DIRECT.GET.{stream}"
        return _stored(await Replies.of(nc).request(request, body, None, timeout))
    subject = f"{API_PREFIX}.DIRECT.GET.{stream}.{subject}"
    return _stored(await Replies.of(nc).request(subject, b"", None, timeout))


async def first_after(
    nc: NATS, stream: str, subject: str, seq: int, *, timeout: float = 5.0, min_last_seq: int = 0
) -> StoredMessage | None:
    """The first message on `subject` with a stream sequence above `seq`; `min_last_seq` as
    for `last_for_subject`."""
    request: dict[str, Any] = {"seq": seq + 1, "next_by_subj": subject}
    if min_last_seq:
        request["min_last_seq"] = min_last_seq
    body = json.dumps(request).encode()
    return _stored(
        await Replies.of(nc).request(f"{API_PREFIX}.DIRECT.GET.{stream}", body, None, timeout)
    )


async def first_since(
    nc: NATS, stream: str, when: datetime, *, timeout: float = 5.0
) -> StoredMessage | None:
    """The first message of the stream stored at or after `when`, or None when there is none."""
    body = json.dumps({"start_time": when.astimezone(UTC).isoformat()}).encode()
    return _stored(
        await Replies.of(nc).request(f"{API_PREFIX}.DIRECT.GET.{stream}", body, None, timeout)
    )


async def iter_subject(
    nc: NATS,
    stream: str,
    subject: str,
    *,
    after_seq: int = 0,
    batch: int = 256,
    timeout: float = 5.0,
    min_last_seq: int = 0,
) -> AsyncGenerator[StoredMessage, None]:
    """Every message on `subject` after `after_seq`, in order, up to `batch` per round trip.

    `min_last_seq`: asks for a replica that holds the stream up to there at least — NATS's
    read-after-write design has a follower behind it hand the request to the leader, or
    answer 412 (raised here as PlatformError) — so that with a replicated stream a lagging
    follower does not end the reading early, as if nothing more were stored. One server
    answers as without it (tests/fault/test_nats_cluster.py reads a cluster's log with it)."""
    replies = Replies.of(nc)
    start = after_seq + 1
    pending = 1
    while pending:
        # Bounded in bytes too: the server sends a batch whole, with no flow control, and it
        # waits in memory for the reader — 256 messages of 8 MB are 2 GB.
        request_body = {
            "seq": start,
            "next_by_subj": subject,
            "batch": batch,
            "max_bytes": BATCH_BYTES,
        }
        if min_last_seq:
            request_body["min_last_seq"] = min_last_seq
        body = json.dumps(request_body).encode()
        request = replies.replies(f"{API_PREFIX}.DIRECT.GET.{stream}", body, timeout)
        async with contextlib.aclosing(request):  # its token is dropped as soon as we stop
            async for msg in request:
                headers = msg.headers or {}
                if headers.get("Status") in {"204", "404"}:  # end of batch / nothing (more)
                    pending = int(headers.get("Nats-Num-Pending", "0"))
                    break
                stored = _stored(msg)
                assert stored is not None
                start = stored.seq + 1
                yield stored
