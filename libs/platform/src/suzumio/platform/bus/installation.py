"""The installation's id: made once, by whichever service asks first, and kept for good in
its namespace's `installation` bucket.

A sandbox engine that several installations share (one Docker engine, one Kubernetes
namespace) holds all of their sandboxes, and the platform namespace alone does not tell them
apart: every installation that kept the default one has the same. Each sandbox carries the
id, and an installation's reconciliation leaves the others' alone.
"""

from __future__ import annotations

import asyncio
import time

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NoStreamResponseError, ServiceUnavailableError

from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.kv import ensure_kv

INSTALLATION_BUCKET = "installation"
_KEY = "id"
READY_SECONDS = 30.0
RETRY_SECONDS = 0.25
NOT_READY = (NoRespondersError, NoStreamResponseError, NatsTimeoutError, ServiceUnavailableError)


async def installation_id(
    js: JetStreamContext, topology: Topology, *, replicas: int = 1, wait: float = READY_SECONDS
) -> str:
    """This installation's id, made now if nobody made it before (the first to write wins:
    replicas starting together agree).

    A bucket just made on a cluster answers nothing until its replicas elected a leader (no
    responders, no response): asked again for up to `wait` seconds — a service started with
    its cluster's first moments exited at once. A create that landed with its answer lost is
    found as made when asked again."""
    kv = await ensure_kv(js, topology.bucket(INSTALLATION_BUCKET), ttl=0, replicas=replicas)
    deadline = time.monotonic() + wait
    while True:
        try:
            try:
                made = new_id()
                await kv.create(_KEY, made.encode())
            except KeyWrongLastSequenceError:
                entry = await kv.get(_KEY)
                assert entry.value is not None
                return entry.value.decode()
        except NOT_READY:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(RETRY_SECONDS)
            continue
        return made
