"""What a pool worker says it stored is not taken on its word: the orchestrator records an
output as an artifact only if its bytes are in the object store and it is within the limits
(real NATS, Postgres and session service)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import FileRef
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, blob_name
from suzumio.orchestrator.artifacts import ArtifactCollector, Collection
from suzumio.orchestrator.backends.base import Exit
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.db import pool as db
from tests.e2e.api import new_world, ok
from tests.e2e.stack import Stack
from tests.support import eventually


async def test_only_stored_outputs_within_the_limits_become_artifacts(
    platform: Stack, tmp_path: Path
) -> None:
    world = await new_world(platform, "wren-remote")
    js = platform.nc.jetstream()
    bucket = platform.topology.bucket(ARTIFACTS_BUCKET)
    store = await ensure_object_store(js, bucket)

    async def stored(data: bytes, path: str) -> FileRef:
        digest = hashlib.sha256(data).hexdigest()
        await store.put(blob_name(digest), data)
        return FileRef(path=path, sha256=digest, size=len(data))

    kept = await stored(b"a report", "report.md")
    too_big = await stored(b"x" * 500, "big.bin")
    never_stored = FileRef(path="ghost.txt", sha256="ab" * 32, size=4)
    also_kept = await stored(b"1,2\n", "data/table.csv")
    pg = await db.create_pool(platform.database_url, "remote-outputs", max_size=2)
    try:
        collector = ArtifactCollector(
            js,
            store,
            bucket,
            pg,
            CommandClient(platform.nc, platform.topology),
            max_bytes=100,
            max_files=4,
        )
        target = Collection(world.project_id, world.session_id, new_id(), "pool", tmp_path)
        outputs = (kept, too_big, never_stored, also_kept)
        recorded = await collector.collect(target, Exit(0, outputs=outputs))
    finally:
        await pg.close()
    assert recorded == ["report.md", "data/table.csv"]

    async def listed() -> list[str]:
        async with platform.client(world.key) as c:
            body = ok(await c.get(f"/v1/projects/{world.project_id}/artifacts"))
        return sorted(a["path"] for a in body["items"])

    # Every command was answered before `collect` returned: only the projection may lag.
    assert await eventually(listed, lambda paths: len(paths) >= 2) == [
        "data/table.csv",
        "report.md",
    ]
