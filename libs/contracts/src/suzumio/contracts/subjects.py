"""Subjects and streams: where every message of the platform travels (DESIGN.md §4).

A `Topology` names them. The default has no namespace (`EVENTS`, `ev.session.<id>`); a
namespace prefixes every stream and subject, so several installations (or tests) can share one
NATS account without seeing each other.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

_NAMESPACE_RE = re.compile(r"^[a-z][a-z0-9]{0,31}$")
ARTIFACTS_BUCKET = "artifacts"
"""The object store of artifact bytes (`blob_name`), shared by the gateway, the orchestrator
and the pool's workers."""


def blob_name(sha256_hex: str) -> str:
    """The object holding the bytes whose SHA-256 is `sha256_hex`."""
    return f"sha256/{sha256_hex}"


# How long LIVE remembers a chunk's message id: long enough for a runner's retries of a batch
# (seconds), short enough that the ids remembered at thousands of chunks a second stay a few
# megabytes. The tool-broker counts a batch sent again after it as new bytes.
LIVE_DUPLICATE_WINDOW_SECONDS = 30.0


class Storage(StrEnum):
    FILE = "file"
    MEMORY = "memory"


class Retention(StrEnum):
    LIMITS = "limits"
    WORK_QUEUE = "workqueue"


class StreamSpec(BaseModel):
    """What a JetStream stream must look like; created or updated idempotently at start."""

    model_config = ConfigDict(frozen=True)

    name: str
    subjects: tuple[str, ...]
    storage: Storage
    retention: Retention = Retention.LIMITS
    max_age_seconds: float = 0.0
    max_bytes: int = -1  # -1: unbounded; else the oldest messages go (`discard: old`)
    duplicate_window_seconds: float = 120.0
    replicas: int = 1
    allow_direct: bool = True
    allow_msg_ttl: bool = False  # a message may carry its own max age (`Nats-TTL`)
    description: str = ""


class Topology(BaseModel):
    """The names of streams and subjects for one installation."""

    model_config = ConfigDict(frozen=True)

    namespace: str = Field(default="", description="lowercase prefix; empty for none")
    live_max_age_seconds: float = 600.0
    # LIVE is held in the NATS server's memory: an operator may bound it as a whole (one
    # sandbox looping on `/runner/stream` at 2 M characters a call fills gigabytes for the
    # ten minutes it keeps them); past it the oldest chunks go — the history is the record.
    # -1: unbounded, the default — JetStream reserves a bound in its memory store up front,
    # for each installation's LIVE (and each test's namespace), whatever it holds.
    live_max_bytes: int = Field(default=-1, ge=-1)
    replicas: int = Field(default=1, ge=1, le=5)

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        if value and not _NAMESPACE_RE.fullmatch(value):
            raise ValueError("namespace must be lowercase letters and digits, starting a letter")
        return value

    def _subject(self, *tokens: str) -> str:
        prefix = (self.namespace,) if self.namespace else ()
        return ".".join((*prefix, *tokens))

    def _stream(self, name: str) -> str:
        return f"{self.namespace.upper()}_{name}" if self.namespace else name

    # -- streams -------------------------------------------------------------------------
    @property
    def events_stream(self) -> str:
        return self._stream("EVENTS")

    @property
    def live_stream(self) -> str:
        return self._stream("LIVE")

    @property
    def activations_stream(self) -> str:
        return self._stream("ACTIVATIONS")

    @property
    def claims_stream(self) -> str:
        return self._stream("CLAIMS")

    def streams(self) -> tuple[StreamSpec, ...]:
        return (
            StreamSpec(
                name=self.events_stream,
                subjects=(self._subject("ev", ">"),),
                storage=Storage.FILE,
                replicas=self.replicas,
                description="the event log: every domain event, one subject per aggregate",
            ),
            StreamSpec(
                name=self.live_stream,
                subjects=(self._subject("live", ">"),),
                storage=Storage.MEMORY,
                max_age_seconds=self.live_max_age_seconds,
                max_bytes=self.live_max_bytes,
                duplicate_window_seconds=LIVE_DUPLICATE_WINDOW_SECONDS,
                replicas=self.replicas,
                description="live output (token chunks, tool progress); short retention",
            ),
            StreamSpec(
                name=self.activations_stream,
                subjects=(self._subject("act", ">"),),
                storage=Storage.FILE,
                retention=Retention.WORK_QUEUE,
                replicas=self.replicas,
                description="activation dispatches for warm worker pools",
            ),
            StreamSpec(
                name=self.claims_stream,
                subjects=(self._subject("claim", ">"),),
                storage=Storage.FILE,
                # Each claim lives to its dispatch's deadline (its own TTL); this bounds one
                # written without (the longest wall clock a profile may ask for, and a day).
                max_age_seconds=8 * 86_400.0,
                allow_msg_ttl=True,
                replicas=self.replicas,
                description="dispatches a pool worker started: a redelivery of one is refused",
            ),
        )

    # -- subjects ------------------------------------------------------------------------
    def event_subject(self, aggregate: str, aggregate_id: str) -> str:
        return self._subject("ev", aggregate, aggregate_id)

    def events_filter(self, aggregate: str | None = None) -> str:
        return self._subject("ev", aggregate, "*") if aggregate else self._subject("ev", ">")

    def parse_event_subject(self, subject: str) -> tuple[str, str]:
        """The (aggregate, id) an event subject names."""
        tokens = subject.split(".")
        if self.namespace:
            tokens = tokens[1:]
        if len(tokens) != 3 or tokens[0] != "ev":
            raise ValueError(f"not an event subject: {subject!r}")
        return tokens[1], tokens[2]

    def live_subject(self, session_id: str) -> str:
        return self._subject("live", "session", session_id)

    def activation_subject(self, pool: str) -> str:
        return self._subject("act", pool)

    def worker_activation_subject(self, pool: str, worker_id: str) -> str:
        """Dispatches for one worker of `pool` (session affinity): its own consumer takes them."""
        return self._subject("act", pool, "worker", worker_id)

    def activations_filter(self) -> str:
        """Every dispatch of every pool, shared and routed to a worker."""
        return self._subject("act", ">")

    def command_subject(self, service: str, verb: str) -> str:
        return self._subject("cmd", service, verb)

    def command_filter(self, service: str) -> str:
        return self._subject("cmd", service, "*")

    def command_queue_group(self, service: str) -> str:
        return self._subject("svc", service)

    # -- worker pools: core NATS between the pool backend and its workers -----------------
    def pool_consumer(self, pool: str) -> str:
        """The durable consumer on ACTIVATIONS that every worker of `pool` pulls from."""
        return f"pool_{pool}"

    def worker_consumer(self, pool: str, worker_id: str) -> str:
        """The consumer of the dispatches routed to one worker (`worker_activation_subject`)."""
        return f"pool_{pool}_worker_{worker_id}"

    def claim_subject(self, dispatch_id: str) -> str:
        """Where a pool worker claims a dispatch it starts (`CLAIMS`)."""
        return self._subject("claim", dispatch_id)

    def pool_status_subject(self, activation_id: str) -> str:
        return self._subject("pool", "status", activation_id)

    def pool_cancel_subject(self, activation_id: str) -> str:
        return self._subject("pool", "cancel", activation_id)

    def pool_cancel_filter(self) -> str:
        return self._subject("pool", "cancel", "*")

    def pool_list_subject(self) -> str:
        return self._subject("pool", "list")

    def pool_worker_subject(self, worker_id: str) -> str:
        return self._subject("pool", "worker", worker_id)

    def pool_worker_filter(self) -> str:
        return self._subject("pool", "worker", "*")

    # -- key-value buckets and object stores ----------------------------------------------
    def bucket(self, name: str) -> str:
        """A KV bucket or object store of this installation (`idempotency`, `services`, ...)."""
        return f"{self.namespace}_{name}" if self.namespace else name


DEFAULT_TOPOLOGY = Topology()
