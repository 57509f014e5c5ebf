"""Key-value buckets and object stores on JetStream, created idempotently.

nats-py creates a bucket only if it does not exist or exists exactly as asked: one made with
other settings (a changed TTL or replica count, or an older client's defaults) is refused as
"stream name already in use", which would stop every start of the service for good. Such a
bucket is brought to the settings asked for instead, as `ensure_stream` does for streams.
"""

from __future__ import annotations

import dataclasses

from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from suzumio.platform.bus.jsapi import ERR_STREAM_NAME_IN_USE
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

_DUPLICATE_WINDOW = 120.0  # what nats-py gives a bucket, or its TTL when that is shorter


async def ensure_kv(
    js: JetStreamContext, bucket: str, *, ttl: float, replicas: int = 1, history: int = 1
) -> KeyValue:
    config = KeyValueConfig(
        bucket=bucket, ttl=ttl, replicas=replicas, history=history, storage=StorageType.FILE
    )
    try:
        return await js.create_key_value(config)
    except BadRequestError as exc:
        if exc.err_code != ERR_STREAM_NAME_IN_USE:
            raise
    window = min(ttl, _DUPLICATE_WINDOW) if ttl else _DUPLICATE_WINDOW
    current = await _config(js, f"KV_{bucket}")
    await _update(
        js,
        current,
        dataclasses.replace(
            current,
            max_age=ttl,
            num_replicas=replicas,
            max_msgs_per_subject=history,
            duplicate_window=window,
        ),
    )
    return await js.key_value(bucket)


async def ensure_object_store(
    js: JetStreamContext, bucket: str, *, replicas: int = 1
) -> ObjectStore:
    config = ObjectStoreConfig(bucket=bucket, replicas=replicas, storage=StorageType.FILE)
    try:
        return await js.create_object_store(bucket, config=config)
    except BadRequestError as exc:
        if exc.err_code != ERR_STREAM_NAME_IN_USE:
            raise
    current = await _config(js, f"OBJ_{bucket}")
    await _update(js, current, dataclasses.replace(current, num_replicas=replicas))
    return await js.object_store(bucket)


async def _config(js: JetStreamContext, stream: str) -> StreamConfig:
    return (await js.stream_info(stream)).config


async def _update(js: JetStreamContext, current: StreamConfig, wanted: StreamConfig) -> None:
    if wanted != current:
        await js.update_stream(wanted)
        log.info("bucket.updated", stream=wanted.name)
