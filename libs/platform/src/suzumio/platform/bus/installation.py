"""The installation's id: made once, by whichever service asks first, and kept for good in
its namespace's `installation` bucket.

A sandbox engine that several installations share (one Docker engine, one Kubernetes
namespace) holds all of their sandboxes, and the platform namespace alone does not tell them
apart: every installation that kept the default one has the same. Each sandbox carries the
id, and an installation's reconciliation leaves the others' alone.
"""

from __future__ import annotations

from nats.js.client import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.kv import ensure_kv

INSTALLATION_BUCKET = "installation"
_KEY = "id"


async def installation_id(js: JetStreamContext, topology: Topology, *, replicas: int = 1) -> str:
    """This installation's id, made now if nobody made it before (the first to write wins:
    replicas starting together agree)."""
    kv = await ensure_kv(js, topology.bucket(INSTALLATION_BUCKET), ttl=0, replicas=replicas)
    try:
        made = new_id()
        await kv.create(_KEY, made.encode())
    except KeyWrongLastSequenceError:
        entry = await kv.get(_KEY)
        assert entry.value is not None
        return entry.value.decode()
    return made
