"""The few JetStream API calls nats-py does not model (atomic batches, direct batch gets),
spoken as plain JSON requests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from suzumio.contracts.subjects import StreamSpec
from suzumio.platform.errors import JetStreamApiError, PlatformError
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

ERR_STREAM_NOT_FOUND = 10059
ERR_STREAM_NAME_IN_USE = 10058
# A cluster still forming (or electing its meta leader) answers so: "no suitable peers for
# placement" while its peers are not all known yet (for good, where a stream asks for more
# replicas than the cluster has nodes: it fails after the retries), "JetStream system
# temporarily unavailable" (503) while it has no meta leader.
ERR_NO_PEERS_YET = 10005
ERR_TEMPORARILY_UNAVAILABLE = 10008
API_PREFIX = "$JS.API"
_NANOS = 1_000_000_000


async def request(nc: NATS, subject: str, payload: dict[str, Any] | None, timeout: float) -> Any:
    """One JetStream API request; an error reply becomes `JetStreamApiError`."""
    body = json.dumps(payload).encode() if payload is not None else b""
    msg = await nc.request(subject, body, timeout=timeout)
    reply = json.loads(msg.data)
    error = reply.get("error")
    if error:
        raise JetStreamApiError(
            error.get("code", 0), error.get("err_code", 0), error["description"]
        )
    return reply


def stream_config(spec: StreamSpec) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "subjects": list(spec.subjects),
        "storage": spec.storage.value,
        "retention": spec.retention.value,
        "max_age": int(spec.max_age_seconds * _NANOS),
        "max_bytes": spec.max_bytes,
        "duplicate_window": int(spec.duplicate_window_seconds * _NANOS),
        "num_replicas": spec.replicas,
        "allow_direct": spec.allow_direct,
        "discard": "old",
    }
    if spec.allow_msg_ttl:
        config["allow_msg_ttl"] = True
    if spec.storage.value == "file" and spec.retention.value == "limits":
        # The log is the truth: nothing may be deleted from it through the API.
        config["deny_delete"] = True
        config["deny_purge"] = True
    if spec.max_age_seconds and spec.duplicate_window_seconds > spec.max_age_seconds:
        config["duplicate_window"] = config["max_age"]
    return config


def _drifted(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return any(current.get(key) != value for key, value in wanted.items() if key != "name")


async def ensure_stream(nc: NATS, spec: StreamSpec, *, timeout: float = 10.0) -> None:
    """Create the stream, or bring its mutable settings to `spec`. Safe to race with others."""
    wanted = stream_config(spec)
    for _ in range(5):
        try:
            info = await request(nc, f"{API_PREFIX}.STREAM.INFO.{spec.name}", None, timeout)
        except JetStreamApiError as exc:
            if exc.err_code != ERR_STREAM_NOT_FOUND:
                raise
        else:
            if _drifted(info["config"], wanted):
                merged = {**info["config"], **wanted}
                await request(nc, f"{API_PREFIX}.STREAM.UPDATE.{spec.name}", merged, timeout)
                log.info("stream.updated", stream=spec.name)
            return
        try:
            await request(nc, f"{API_PREFIX}.STREAM.CREATE.{spec.name}", wanted, timeout)
        except JetStreamApiError as exc:
            if exc.err_code != ERR_STREAM_NAME_IN_USE:  # another process won the race
                raise
        else:
            log.info("stream.created", stream=spec.name)
            return
    raise PlatformError(f"could not ensure stream {spec.name}")


def _starting(exc: JetStreamApiError) -> bool:
    # Not any 503: "JetStream not enabled" and "insufficient resources" do not pass.
    return exc.err_code in {ERR_NO_PEERS_YET, ERR_TEMPORARILY_UNAVAILABLE}


async def ensure_streams(nc: NATS, specs: tuple[StreamSpec, ...], *, attempts: int = 30) -> None:
    """Ensure every stream, waiting out a JetStream that is still starting (a cluster still
    forming answers with errors of its own: services started with it stopped at once)."""
    for attempt in range(attempts):
        try:
            for spec in specs:
                await ensure_stream(nc, spec)
        except (TimeoutError, NoRespondersError, NatsTimeoutError, JetStreamApiError) as exc:
            if attempt == attempts - 1 or (
                isinstance(exc, JetStreamApiError) and not _starting(exc)
            ):
                raise
            await asyncio.sleep(min(0.1 * (attempt + 1), 1.0))
        else:
            return


async def stream_last_seq(nc: NATS, stream: str, *, timeout: float = 5.0) -> int:
    info = await request(nc, f"{API_PREFIX}.STREAM.INFO.{stream}", None, timeout)
    return int(info["state"]["last_seq"])


async def stream_state(nc: NATS, stream: str, *, timeout: float = 5.0) -> dict[str, Any]:
    info = await request(nc, f"{API_PREFIX}.STREAM.INFO.{stream}", None, timeout)
    state: dict[str, Any] = info["state"]
    return state
