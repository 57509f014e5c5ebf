"""Key-value buckets and object stores on JetStream, created idempotently."""

from __future__ import annotations

from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore


async def ensure_kv(
    js: JetStreamContext, bucket: str, *, ttl: float, replicas: int = 1, history: int = 1
) -> KeyValue:
    config = KeyValueConfig(
        bucket=bucket, ttl=ttl, replicas=replicas, history=history, storage=StorageType.FILE
    )
    return await js.create_key_value(config)


async def ensure_object_store(
    js: JetStreamContext, bucket: str, *, replicas: int = 1
) -> ObjectStore:
    config = ObjectStoreConfig(bucket=bucket, replicas=replicas, storage=StorageType.FILE)
    return await js.create_object_store(bucket, config=config)
