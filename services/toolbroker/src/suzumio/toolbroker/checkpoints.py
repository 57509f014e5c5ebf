"""`GET /runner/checkpoint`: the latest checkpoint of the token's session, read on from where
the last call on that session read — its whole history once per replica, then only what came
after. (Read whole at each call, an agent asking again and again had the broker decode the
session's every event each time, holding its other activations' calls.)"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import EventEnvelope, decode_data
from suzumio.contracts.events import CheckpointSaved
from suzumio.contracts.runner import CheckpointRef
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.direct_get import first_after
from suzumio.platform.bus.eventstore import EventStore, Head, envelopes_of

MAX_SESSIONS = 4_096  # sessions whose reading place a replica remembers (the oldest go first)


@dataclass(frozen=True, slots=True)
class _Read:
    head: Head  # read up to here
    checkpoint_seq: int | None  # the commit holding the latest checkpoint, if any


class LatestCheckpoints:
    def __init__(self, nc: NATS, topology: Topology, store: EventStore) -> None:
        self._nc = nc
        self._topology = topology
        self._store = store
        self._read: OrderedDict[str, _Read] = OrderedDict()

    async def latest(self, session_id: str) -> CheckpointRef | None:
        before = self._read.pop(session_id, None)
        stream = await self._store.load(
            "session", session_id, after=before.head if before else None
        )
        found: CheckpointRef | None = None
        checkpoint_seq = before.checkpoint_seq if before else None
        for event in stream.events:
            if isinstance(event.data, CheckpointSaved):
                found, checkpoint_seq = _ref(event.envelope, event.data), event.seq
        head = Head(stream.version, stream.seq) if stream.events else None
        self._read[session_id] = _Read(
            head or (before.head if before else Head(0, 0)), checkpoint_seq
        )
        while len(self._read) > MAX_SESSIONS:
            self._read.popitem(last=False)
        if found is not None or checkpoint_seq is None:
            return found
        return await self._at(session_id, checkpoint_seq)

    async def _at(self, session_id: str, seq: int) -> CheckpointRef | None:
        """The last checkpoint in the session's commit at `seq`."""
        subject = self._topology.event_subject("session", session_id)
        stored = await first_after(self._nc, self._topology.events_stream, subject, seq - 1)
        found = None
        if stored is not None and stored.seq == seq:
            for envelope in envelopes_of(stored.data):
                if envelope.type == CheckpointSaved.event_type:
                    data = decode_data(envelope)
                    assert isinstance(data, CheckpointSaved)
                    found = _ref(envelope, data)
        return found


def _ref(envelope: EventEnvelope, data: CheckpointSaved) -> CheckpointRef:
    return CheckpointRef(id=data.checkpoint_id, created_at=envelope.occurred_at, data=data.data)
