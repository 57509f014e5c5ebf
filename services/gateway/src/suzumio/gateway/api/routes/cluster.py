"""What runs and how it is doing: services seen, read model lag, stream sizes, backends."""

from __future__ import annotations

from fastapi import APIRouter

from suzumio.gateway.api.deps import AdminDep, GatewayDep
from suzumio.gateway.api.models import (
    ClusterStatus,
    ProjectionStatus,
    ServiceSeen,
    StreamStatus,
)
from suzumio.gateway.api.routes.common import RESPONSES
from suzumio.platform.bus.jsapi import stream_state
from suzumio.platform.projections.checkpoints import read_all
from suzumio.platform.service.heartbeat import alive

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=RESPONSES)


@router.get("/status")
async def cluster_status(gw: GatewayDep, _: AdminDep) -> ClusterStatus:
    """For platform admins. Backends report their health here once they run."""
    streams = {}
    for spec in gw.topology.streams():
        state = await stream_state(gw.nc, spec.name)
        streams[spec.name] = StreamStatus(
            messages=state["messages"],
            bytes=state["bytes"],
            consumers=state.get("consumer_count", 0),
            last_seq=state["last_seq"],
        )
    last = streams[gw.topology.events_stream].last_seq
    projections = {
        name: ProjectionStatus(
            version=cp.version,
            position=cp.position,
            lag=max(last - cp.position, 0),
            rebuilt_at=cp.rebuilt_at,
        )
        for name, cp in sorted((await read_all(gw.pool)).items())
    }
    seen = await alive(gw.services)
    services = [ServiceSeen.model_validate(s) for s in seen]
    backends = [b for s in seen for b in s.get("backends", [])]
    return ClusterStatus(
        services=services, projections=projections, streams=streams, backends=backends
    )
