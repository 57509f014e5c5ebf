"""Service instances announce themselves in the `services` KV bucket; entries expire when an
instance stops beating, so the bucket lists what is alive (for `GET /v1/cluster/status`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from nats.js.kv import KeyValue

from suzumio.platform.logging import get_logger

log = get_logger(__name__)
BUCKET = "services"
TTL_SECONDS = 20.0
INTERVAL_SECONDS = 5.0


def instance_key(service: str, instance: str) -> str:
    return f"{service}.{re.sub(r'[^A-Za-z0-9_=-]', '-', instance)}"


class Heartbeat:
    def __init__(
        self, kv: KeyValue, service: str, instance: str, describe: Callable[[], dict[str, Any]]
    ) -> None:
        self._kv = kv
        self._key = instance_key(service, instance)
        self._describe = describe
        self._started = time.time()
        self._base = {"service": service, "instance": instance, "started_at": self._started}

    async def beat(self) -> None:
        body = {**self._base, **self._describe(), "seen_at": time.time()}
        await self._kv.put(self._key, json.dumps(body).encode())

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.beat()
            except Exception as exc:
                log.warning("heartbeat.failed", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), INTERVAL_SECONDS)
        with contextlib.suppress(Exception):
            await self._kv.delete(self._key)


async def alive(kv: KeyValue) -> list[dict[str, Any]]:
    """Every instance that beat within the bucket's TTL."""
    try:
        keys = await kv.keys()
    except Exception:  # nats-py raises NoKeysError on an empty bucket
        return []
    found = []
    for key in keys:
        with contextlib.suppress(Exception):
            entry = await kv.get(key)
            if entry.value:
                found.append(json.loads(entry.value))
    return sorted(found, key=lambda e: (e.get("service", ""), e.get("instance", "")))
