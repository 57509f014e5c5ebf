"""The event store: conditional appends to, and reads of, one subject per aggregate on EVENTS.

An append is one message (a commit): the event's envelope, or a JSON array of the envelopes
when one decision produced several events, so they are stored together or not at all. It
carries `Nats-Expected-Last-Subject-Sequence` (the aggregate's last stream sequence as the
writer knows it) so JetStream itself refuses a writer that did not see the latest event, and
`Nats-Msg-Id` (the first event's id) so a publish retried after a lost ack is stored once.
(JetStream's atomic batches would keep one event per message, but on file storage each batch
commit is synced to disk: ~2 ms, serialised per stream, capping multi-event appends at a few
hundred a second. A commit message costs what a single event does.)

Callers speak in aggregate versions; the store maps a version to the stream sequence the
server checks, from what it has seen itself or, on a miss, from the last stored message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import TypeAdapter

from suzumio.contracts.commands import EventRef
from suzumio.contracts.envelope import (
    DomainEvent,
    EventEnvelope,
    EventMeta,
    RecordedEvent,
    decode_data,
    envelope_for,
)
from suzumio.contracts.errors import CommandTimeoutError, ConflictError, InvalidError
from suzumio.contracts.ids import is_valid_id
from suzumio.contracts.subjects import DEFAULT_TOPOLOGY, Topology
from suzumio.platform import telemetry
from suzumio.platform.bus.direct_get import StoredMessage, first_after, iter_subject
from suzumio.platform.bus.direct_get import last_for_subject as _last_for_subject
from suzumio.platform.bus.jsapi import API_PREFIX, request, stream_last_seq
from suzumio.platform.bus.replies import Replies, header_bytes
from suzumio.platform.bus.trouble import NATS_TROUBLE
from suzumio.platform.errors import JetStreamApiError, PlatformError
from suzumio.platform.trouble import jetstream_trouble

# The log could not be read now (it says nothing of what is stored).
_UNREADABLE: tuple[type[Exception], ...] = (
    TimeoutError,
    NatsTimeoutError,
    PlatformError,
    *NATS_TROUBLE,
)

HTTP_NOT_FOUND = 404  # a JetStream API answer's code: no message on the subject
HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
HDR_TYPE = "Suzumio-Type"
HDR_VERSION = "Suzumio-Version"

ERR_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
# "duplicate message id is in process": in a cluster, an earlier attempt of this very append
# (its message id) is still being agreed on — stored or not, it is not known yet.
ERR_DUPLICATE_IN_PROCESS = 10158
MAX_EVENTS_PER_APPEND = 1_000
# Room kept past an append's own headers when it is sized: the trace context it is sent under
# may differ from the one it was prepared under.
HEADER_MARGIN = 256
TYPE_SEPARATOR = ","  # Suzumio-Type of a commit lists its events' types in order

_appends = telemetry.meter.create_counter(
    "suzumio_event_appends",
    description="appends (each one message: one event, or a commit of several) by outcome: "
    "ok, conflict (a conditional append refused: the aggregate moved on), error",
)
_append_seconds = telemetry.meter.create_histogram(
    "suzumio_event_append_duration",
    unit="s",
    description="append round trip",
    explicit_bucket_boundaries_advisory=telemetry.LATENCY_BUCKETS,
)


class ConcurrencyConflictError(ConflictError):
    """Another writer appended to the aggregate first; reload it and decide again."""

    def __init__(self, aggregate: str, aggregate_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"{aggregate} {aggregate_id} is at version {actual}, not {expected}",
            aggregate=aggregate,
            aggregate_id=aggregate_id,
            expected_version=expected,
            actual_version=actual,
        )
        self.expected_version = expected
        self.actual_version = actual


@dataclass(frozen=True, slots=True)
class AppendResult:
    events: tuple[EventRef, ...]

    @property
    def version(self) -> int:
        return self.events[-1].version

    @property
    def seq(self) -> int:
        return self.events[-1].seq


@dataclass(frozen=True, slots=True)
class Head:
    """Where an aggregate stands: its version and the stream sequence of its last event."""

    version: int
    seq: int


@dataclass(frozen=True, slots=True)
class AggregateStream:
    aggregate: str
    aggregate_id: str
    events: tuple[RecordedEvent[DomainEvent], ...]

    @property
    def version(self) -> int:
        return self.events[-1].version if self.events else 0

    @property
    def seq(self) -> int:
        return self.events[-1].seq if self.events else 0


@dataclass(frozen=True, slots=True)
class _Prepared:
    subject: str
    aggregate: str
    aggregate_id: str
    expected_version: int
    expected_seq: int
    envelopes: tuple[EventEnvelope, ...]
    payload: bytes


class EventStore:
    """Appends and reads events of aggregates on the EVENTS stream of a topology.

    Appends to different aggregates may run concurrently from one process (they pipeline over
    the one connection); appends to the same aggregate are serialised by the server.
    """

    def __init__(
        self,
        nc: NATS,
        topology: Topology = DEFAULT_TOPOLOGY,
        *,
        timeout: float = 5.0,
        attempts: int = 4,
        cache_size: int = 200_000,
    ) -> None:
        self._nc = nc
        self.topology = topology
        self._stream = topology.events_stream
        self._timeout = timeout
        self._attempts = attempts
        self._heads: OrderedDict[str, Head] = OrderedDict()
        self._cache_size = cache_size
        self._replies = Replies.of(nc)

    # -- appending -----------------------------------------------------------------------
    async def append(
        self,
        aggregate_id: str,
        events: Sequence[DomainEvent],
        expected_version: int,
        meta: EventMeta | None = None,
    ) -> AppendResult:
        """Append `events` to the aggregate if it is still at `expected_version`.

        Raises:
            ConcurrencyConflictError: the aggregate moved on (or is not at that version).
            CommandTimeoutError: the server never confirmed and the events could not be found
                afterwards; the outcome is unknown (they may still be stored), so callers
                re-read the aggregate before deciding anything else.
        """
        prepared = await self.prepare(aggregate_id, events, expected_version, meta)
        return await self.commit(prepared)

    async def append_next(
        self,
        aggregate_id: str,
        events: Sequence[DomainEvent],
        meta: EventMeta | None = None,
        *,
        attempts: int = 20,
        likely_version: int | None = None,
    ) -> AppendResult:
        """Append at whatever version the aggregate has, for append-only logs with no rules.

        `likely_version`: where the caller expects the aggregate to be (0 for one it just
        created the id of), tried first without asking the server; a wrong guess costs a
        refused append."""
        aggregate = events[0].aggregate if events else ""
        version = likely_version
        for _ in range(attempts):
            if version is None:
                version = (await self.head(aggregate, aggregate_id)).version
            try:
                return await self.append(aggregate_id, events, version, meta)
            except ConcurrencyConflictError as exc:
                version = exc.actual_version  # read by the refusal: no lookup of our own
                await asyncio.sleep(0)
        raise ConflictError(f"{aggregate} {aggregate_id} kept moving; gave up appending")

    async def prepare(
        self,
        aggregate_id: str,
        events: Sequence[DomainEvent],
        expected_version: int,
        meta: EventMeta | None = None,
    ) -> _Prepared:
        """Build the messages of an append (ids fixed from here on, so retries are harmless)."""
        if not events:
            raise InvalidError("an append needs at least one event")
        if len(events) > MAX_EVENTS_PER_APPEND:
            raise InvalidError(f"at most {MAX_EVENTS_PER_APPEND} events per append")
        aggregate = events[0].aggregate
        if any(e.aggregate != aggregate for e in events):
            raise InvalidError("all events of an append must belong to one aggregate")
        if not is_valid_id(aggregate_id):
            raise InvalidError(f"invalid aggregate id {aggregate_id!r}")
        if expected_version < 0:
            raise InvalidError("expected_version must be >= 0")
        subject = self.topology.event_subject(aggregate, aggregate_id)
        try:
            expected_seq = await self._expected_seq(
                subject, aggregate, aggregate_id, expected_version
            )
        except ConcurrencyConflictError:
            # Refused before it was sent (the head as seen says the writer is stale): a
            # conflict all the same, as the server's refusal is.
            _appends.add(1, {"outcome": "conflict"})
            raise
        meta = meta or EventMeta()
        envelopes = tuple(
            envelope_for(e, aggregate_id=aggregate_id, version=expected_version + i, meta=meta)
            for i, e in enumerate(events, start=1)
        )
        payload = (
            envelopes[0].model_dump_json(by_alias=True).encode()
            if len(envelopes) == 1
            else _COMMIT.dump_json(list(envelopes), by_alias=True)
        )
        prepared = _Prepared(
            subject, aggregate, aggregate_id, expected_version, expected_seq, envelopes, payload
        )
        # The server counts the headers too (every event's type among them, and the trace
        # context), and answers a message over its limit by closing the connection.
        room = self._nc.max_payload - header_bytes(self._headers(prepared)) - HEADER_MARGIN
        if len(payload) > room:
            # A command that fit on the bus can still make events that do not (each envelope
            # adds its fields): refused as input, not failed as the server's fault.
            raise InvalidError(
                f"the events are {len(payload)} bytes; this append carries at most "
                f"{room} bytes: send less"
            )
        return prepared

    async def commit(self, prepared: _Prepared) -> AppendResult:
        """Publish a prepared append; calling it again for the same one is harmless."""
        # No span of its own: an append is one hop inside the command's span, whose context
        # rides along in the first message's headers to every consumer of the event.
        started = time.perf_counter()
        try:
            seq = await self._publish(prepared)
        except ConflictError:
            _appends.add(1, {"outcome": "conflict"})
            raise
        except Exception:
            _appends.add(1, {"outcome": "error"})
            raise
        _appends.add(1, {"outcome": "ok"})
        _append_seconds.record(time.perf_counter() - started)
        count = len(prepared.envelopes)
        self._remember(prepared.subject, Head(prepared.expected_version + count, seq))
        return AppendResult(
            tuple(
                EventRef(
                    id=env.id,
                    type=env.type,
                    aggregate=env.aggregate,
                    aggregate_id=env.aggregate_id,
                    version=env.version,
                    seq=seq,
                )
                for env in prepared.envelopes
            )
        )

    async def _publish(self, p: _Prepared) -> int:
        unsure = False  # an earlier attempt may have been stored (its answer never came)
        for attempt in range(self._attempts):
            try:
                reply = await self._send(p)
            except (TimeoutError, NatsTimeoutError, NoRespondersError):
                # The ack may be lost while the events were stored: look before retrying.
                stored = await self._find_own(p, tolerate_errors=True)
                if stored is not None:
                    return stored
                unsure = True
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            except NATS_TROUBLE:
                if not unsure:
                    raise  # nothing sent that may have been stored: unavailable, as it is
                # The connection gone now (closed, its buffer full while it reconnects) says
                # nothing of the earlier attempt, which may have been stored: unknown.
                if (stored := await self._find_own(p, tolerate_errors=True)) is not None:
                    return stored
                raise CommandTimeoutError(
                    f"event store could not tell whether the append to {p.subject} was stored",
                    subject=p.subject,
                ) from None
            error = reply.get("error")
            if not error:
                return int(reply["seq"])  # also for `"duplicate": true`: the first copy's seq
            if int(error.get("err_code", 0)) == ERR_DUPLICATE_IN_PROCESS:
                # Asked again after a pause, the server answers for the earlier attempt:
                # stored (`duplicate`, with its sequence) or refused.
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            return await self._refused(p, error, unsure=unsure)
        stored = await self._find_own(p, tolerate_errors=True)
        if stored is not None:
            return stored
        raise CommandTimeoutError(
            f"event store did not confirm the append to {p.subject}", subject=p.subject
        )

    async def _refused(self, p: _Prepared, error: dict[str, Any], *, unsure: bool) -> int:
        """The server refused the append: its sequence if an attempt of it was stored after
        all, else the refusal raised as what it means."""
        err_code = int(error.get("err_code", 0))
        if err_code in ERR_WRONG_LAST_SEQUENCE:
            # The subject's last sequence as the leader has it (in its refusal), else the
            # stream's: what the reads below ask a replica to hold. Conflicts are routine (a
            # fold behind, a stale cache): one look-up for both reads at most.
            floor = _last_sequence_in(str(error.get("description", "")))
            try:
                floor = floor or await self.last_position()
                stored = await self._find_own(p, floor=floor)
                if stored is None:
                    conflict = await self._conflict(p, floor)
            except _UNREADABLE:
                # Refused, perhaps because an earlier attempt of this very append was
                # stored (its ack lost): unknown, not failed, until the log can be read. (Or
                # not, but the version the subject is at could not be read: trouble that
                # passes all the same, not a refusal of the append itself.)
                raise CommandTimeoutError(
                    f"event store refused the append to {p.subject} and could not read the"
                    " subject to tell why (an earlier attempt of it stored, or another write)",
                    subject=p.subject,
                ) from None
            if stored is not None:
                return stored
            raise conflict
        refused = JetStreamApiError(int(error.get("code", 0)), err_code, error["description"])
        if unsure and jetstream_trouble(refused):
            # The server in trouble now (a leader being elected) says nothing of the earlier
            # attempt, which may have been stored: unknown — not a refusal its caller would
            # take as "nothing stored" and make again under new ids.
            if (stored := await self._find_own(p, tolerate_errors=True)) is not None:
                return stored
            raise CommandTimeoutError(
                f"event store could not tell whether the append to {p.subject} was stored",
                subject=p.subject,
            )
        raise refused

    @staticmethod
    def _headers(p: _Prepared) -> dict[str, str]:
        headers = {
            HDR_MSG_ID: p.envelopes[0].id,
            HDR_TYPE: TYPE_SEPARATOR.join(env.type for env in p.envelopes),
            HDR_VERSION: str(p.envelopes[-1].version),
            HDR_EXPECTED_LAST_SUBJECT_SEQ: str(p.expected_seq),
        }
        return telemetry.inject_if_tracing(headers)

    async def _send(self, p: _Prepared) -> dict[str, Any]:
        msg = await self._replies.request(p.subject, p.payload, self._headers(p), self._timeout)
        return dict(orjson.loads(msg.data))

    async def _find_own(
        self, p: _Prepared, *, tolerate_errors: bool = False, floor: int = 0
    ) -> int | None:
        """The seq of our last event if the append was stored after all, else None.

        A conditional append that succeeded is exactly the next message on the subject after
        the sequence it expected, so one read answers whether a lost ack hid a success — with
        `floor`, from a replica holding the log up to there: after a refusal, a follower
        behind ours would answer "not stored" for an append that was (a stored decision taken
        for a conflict). After a lost answer none is asked for: "not stored" there only sends
        the append again, which the duplicate window answers with the first copy's sequence —
        and a floor would need the stream's leader, which a cluster electing one has not.
        """
        try:
            stored = await first_after(
                self._nc, self._stream, p.subject, p.expected_seq, min_last_seq=floor
            )
        except _UNREADABLE:
            if tolerate_errors:
                return None
            raise
        if stored is None or stored.headers.get(HDR_MSG_ID) != p.envelopes[0].id:
            return None
        return stored.seq

    async def _conflict(self, p: _Prepared, floor: int) -> ConcurrencyConflictError:
        self._heads.pop(p.subject, None)
        head = await self._head_of(p.subject, floor)
        return ConcurrencyConflictError(
            p.aggregate, p.aggregate_id, p.expected_version, head.version
        )

    # -- versions and sequences ----------------------------------------------------------
    async def _expected_seq(
        self, subject: str, aggregate: str, aggregate_id: str, expected_version: int
    ) -> int:
        cached = self._heads.get(subject)
        if cached is not None:
            if cached.version == expected_version:
                self._heads.move_to_end(subject)
                return cached.seq
            if cached.version > expected_version:  # versions only grow: the caller is stale
                raise ConcurrencyConflictError(
                    aggregate, aggregate_id, expected_version, cached.version
                )
        if expected_version == 0:
            return 0
        head = await self._head_of(subject)
        if head.version != expected_version:
            raise ConcurrencyConflictError(aggregate, aggregate_id, expected_version, head.version)
        return head.seq

    async def head(self, aggregate: str, aggregate_id: str, *, latest: bool = False) -> Head:
        """The aggregate's current version and last sequence, read from the server; `latest`:
        as the stream's leader has it, holding every write acknowledged so far (a follower of
        a replicated log may answer before it applied one)."""
        subject = self.topology.event_subject(aggregate, aggregate_id)
        if latest:
            return await self._leaders_head(subject)
        return await self._head_of(subject)

    async def _leaders_head(self, subject: str) -> Head:
        """The subject's head from the stream's own API (`STREAM.MSG.GET`), which its leader
        answers: one round trip, where a look-up of the log's end and a Direct Get holding a
        replica to it took two — on every call of the tool-broker's on a cluster."""
        try:
            reply = await request(
                self._nc,
                f"{API_PREFIX}.STREAM.MSG.GET.{self._stream}",
                {"last_by_subj": subject},
                self._timeout,
            )
        except JetStreamApiError as exc:
            if exc.code != HTTP_NOT_FOUND:
                raise
            head = Head(0, 0)  # nothing on the subject
        else:
            message = reply["message"]
            headers = _header_block(base64.b64decode(message.get("hdrs") or ""))
            data = base64.b64decode(message.get("data") or "")
            head = Head(version_in(headers, data), int(message["seq"]))
        self._remember(subject, head)
        return head

    async def _head_of(self, subject: str, floor: int = 0) -> Head:
        stored = await _last_for_subject(
            self._nc, self._stream, subject, timeout=self._timeout, min_last_seq=floor
        )
        head = Head(0, 0) if stored is None else Head(_version_of(stored), stored.seq)
        self._remember(subject, head)
        return head

    def observe(self, aggregate: str, aggregate_id: str, version: int, seq: int) -> None:
        """Tell the store an aggregate's head seen in the log (by a follower), so the next
        conditional append to it needs no lookup."""
        self._remember(self.topology.event_subject(aggregate, aggregate_id), Head(version, seq))

    def _remember(self, subject: str, head: Head) -> None:
        cached = self._heads.get(subject)
        if cached is None or head.version >= cached.version:
            self._heads[subject] = head
            self._heads.move_to_end(subject)
            if len(self._heads) > self._cache_size:
                self._heads.popitem(last=False)

    # -- reading -------------------------------------------------------------------------
    async def load(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AggregateStream:
        """The events of one aggregate, typed and upcast, in version order; with `after`,
        only those newer than that head (to bring a cached state up to date); `min_last_seq`
        as for `events`.

        Raises:
            UnknownEventTypeError: an event of a type this code does not know.
        """
        events = [
            e
            async for e in self.events(
                aggregate, aggregate_id, after=after, min_last_seq=min_last_seq
            )
        ]
        return AggregateStream(aggregate, aggregate_id, tuple(events))

    async def events(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AsyncIterator[RecordedEvent[DomainEvent]]:
        """As `load`, one event at a time as the messages come: a fold over a long history
        holds one message's events, not all of them. `min_last_seq`: from a replica that
        holds the log up to there (`last_position`: a Direct Get of a replicated stream may
        be answered by a follower that has not applied every write acknowledged).

        Raises:
            UnknownEventTypeError: an event of a type this code does not know.
        """
        subject = self.topology.event_subject(aggregate, aggregate_id)
        after = after or Head(0, 0)
        version, seq = after.version, after.seq
        async for stored in iter_subject(
            self._nc,
            self._stream,
            subject,
            after_seq=after.seq,
            timeout=self._timeout,
            min_last_seq=min_last_seq,
        ):
            for envelope in envelopes_of(stored.data):
                if envelope.version != version + 1:
                    raise PlatformError(
                        f"{subject}: version {envelope.version} where {version + 1} was due"
                    )
                version, seq = envelope.version, stored.seq
                yield RecordedEvent(envelope, decode_data(envelope), stored.seq)
        if version > after.version:
            self._remember(subject, Head(version, seq))

    async def first(self, aggregate: str, aggregate_id: str) -> list[EventEnvelope]:
        """The events of the aggregate's first commit (its creation), untyped: one read,
        however long its history."""
        subject = self.topology.event_subject(aggregate, aggregate_id)
        stored = await first_after(self._nc, self._stream, subject, 0, timeout=self._timeout)
        return [] if stored is None else envelopes_of(stored.data)

    async def last_position(self) -> int:
        """The stream's last sequence: the position a reader must reach to see everything."""
        return await stream_last_seq(self._nc, self._stream, timeout=self._timeout)


_LAST_SEQUENCE = re.compile(r"wrong last sequence: (\d+)")


def _last_sequence_in(description: str) -> int:
    """The subject's last sequence a "wrong last sequence: N" refusal names; 0 when none."""
    found = _LAST_SEQUENCE.search(description)
    return int(found.group(1)) if found else 0


_COMMIT: TypeAdapter[list[EventEnvelope]] = TypeAdapter(list[EventEnvelope])


def envelopes_of(data: bytes) -> list[EventEnvelope]:
    """The envelopes a stored message holds: one event, or a commit of several."""
    if data[:1] == b"[":
        return _COMMIT.validate_json(data)
    return [EventEnvelope.model_validate_json(data)]


def types_of(headers: dict[str, str] | None) -> list[str] | None:
    """The event types a stored message holds, from its header (None when absent)."""
    value = (headers or {}).get(HDR_TYPE)
    return value.split(TYPE_SEPARATOR) if value else None


def _header_block(raw: bytes) -> dict[str, str]:
    """A stored message's headers (`NATS/1.0` and its `Name: Value` lines), as JetStream's
    API gives them."""
    headers: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    return headers


def _version_of(stored: StoredMessage) -> int:
    return version_in(stored.headers, stored.data)


def version_in(headers: Mapping[str, str] | None, data: bytes) -> int:
    """The version a commit brings its aggregate to: its `Suzumio-Version` header, else its
    last envelope's; 0 when neither can be read. A malformed header must not raise: a
    follower raising on one message would read it again after every later one, and stop."""
    with contextlib.suppress(KeyError, ValueError, TypeError):
        return int((headers or {})[HDR_VERSION])
    with contextlib.suppress(Exception):
        return envelopes_of(data)[-1].version
    return 0
