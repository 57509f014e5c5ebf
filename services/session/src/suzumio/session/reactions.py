"""Catch-up reactions: steps that must follow an event even when the process that appended
the event died before it could take them.

The command handlers take these steps inline (so a reply already covers them); a durable
consumer takes them again from the log. Each step is idempotent, so the second attempt is a
no-op when the first one landed.
"""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.consumer import ConsumerSpec, PullWorker, event_parker
from suzumio.platform.bus.eventstore import envelopes_of, types_of
from suzumio.session.domain.pending_action import OUTCOMES, PendingActionState
from suzumio.session.handlers.pending_actions import record_resume_signal
from suzumio.session.repository import Repository

DURABLE = "session-resume-signals"


class ResumeSignals:
    """Every answered or expired pending action ends up with its wake-up signal."""

    def __init__(self, nc: NATS, topology: Topology, repo: Repository) -> None:
        self._topology = topology
        self._repo = repo
        spec = ConsumerSpec(
            stream=topology.events_stream,
            durable=DURABLE,
            filter_subjects=(topology.events_filter("pending_action"),),
            max_deliver=10,
        )
        self.worker = PullWorker(nc, spec, self.handle, event_parker(repo.store, DURABLE))

    async def handle(self, msg: Msg) -> None:
        types = types_of(msg.headers)
        if types is not None and OUTCOMES.isdisjoint(types):
            return
        _, action_id = self._topology.parse_event_subject(msg.subject)
        envelopes = envelopes_of(msg.data)
        told = any(e.type in OUTCOMES for e in envelopes)
        state = await self._repo.get(PendingActionState, action_id)
        if state.status not in ("answered", "expired"):
            if told:  # a read behind this very message (a lagging replica): again, later
                raise StaleReadError(f"pending action {action_id} read without its outcome")
            return
        cause = envelopes[-1] if envelopes else None
        meta = EventMeta(
            actor="system:session",
            correlation_id=cause.correlation_id if cause else new_id(),
            causation_id=cause.id if cause else None,
        )
        if await record_resume_signal(self._repo, state, meta) is None and told:
            raise StaleReadError(f"pending action {action_id}'s outcome not found on reading")


class StaleReadError(Exception):
    """What was read is older than the message being handled (in a cluster, a replica that
    lags may answer a read): the message is delivered again after a back-off, not acked
    with its step left undone."""
