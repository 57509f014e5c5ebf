"""Shortcuts for tests that drive the REST API."""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
from nats.js.errors import KeyNotFoundError

from suzumio.contracts.commands import SetRuntimeProfile, UpdateAgent
from suzumio.contracts.live import LiveChunk
from suzumio.contracts.values import Backend, RuntimeProfileSpec
from suzumio.gateway.bootstrap import IDEMPOTENCY_BUCKET
from suzumio.platform.bus.commands import CommandClient
from tests.e2e.stack import Stack
from tests.support import eventually


@contextlib.asynccontextmanager
async def read_models_held(stack: Stack) -> AsyncIterator[None]:
    """The read models standing still while inside: the projector's commit updates its
    checkpoint, held here (so the read-your-writes wait of every write runs out)."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        held = conn.transaction()
        await held.start()
        await conn.execute("SELECT * FROM suzumio.projection_checkpoints FOR UPDATE")
        try:
            yield
        finally:
            await held.rollback()
    finally:
        await conn.close()


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json() if response.content else None


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    return body


@dataclass
class World:
    """A user with a project, an agent and a session of their own."""

    key: str
    user_id: str
    project_id: str
    agent_id: str
    session_id: str


async def new_user(stack: Stack, name: str, *, admin: bool = False) -> tuple[str, str]:
    async with stack.client(stack.admin_key) as c:
        body = ok(await c.post("/v1/users", json={"name": name, "admin": admin}), 201)
    return body["api_key"], body["id"]


async def new_world(stack: Stack, name: str) -> World:
    key, user_id = await new_user(stack, name)
    async with stack.client(key) as c:
        project = ok(await c.post("/v1/projects", json={"name": f"{name}'s project"}), 201)
        agent = ok(
            await c.post(
                f"/v1/projects/{project['id']}/agents",
                json={"name": "helper", "role": "helper", "model": {"name": "demo"}},
            ),
            201,
        )
        session = ok(
            await c.post(
                f"/v1/projects/{project['id']}/sessions",
                json={"agent_id": agent["id"], "title": "t"},
            ),
            201,
        )
    return World(key, user_id, project["id"], agent["id"], session["id"])


async def on_backend(stack: Stack, world: World, backend: str) -> None:
    """Run the world's agent on `backend` (a runtime profile naming it)."""
    if backend == "process":
        return
    spec = RuntimeProfileSpec(
        backend=Backend(backend),
        image="suzumio-runner:latest" if backend == "docker" else None,
        pool="default" if backend == "pool" else None,
    )
    commands = CommandClient(stack.nc, stack.topology)
    await commands.send(
        SetRuntimeProfile(project_id=world.project_id, name="box", spec=spec), actor="system:t"
    )
    await commands.send(
        UpdateAgent(agent_id=world.agent_id, runtime_profile="box"), actor="system:t"
    )


async def upload_artifact(
    stack: Stack, world: World, path: str, data: bytes, content_type: str = "text/plain"
) -> dict[str, Any]:
    """`data` uploaded as an artifact of the world's session at `path`; the artifact."""
    async with stack.client(world.key) as c:
        body = ok(
            await c.post(
                f"/v1/projects/{world.project_id}/artifacts",
                files=[("file", (path, data, content_type))],
                data={"session_id": world.session_id},
            ),
            201,
        )
    item: dict[str, Any] = body["items"][0]
    return item


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


async def in_pages(c: httpx.AsyncClient, url: str, count: int, limit: int = 2) -> list[Any]:
    """The list at `url`, once its read model shows `count` items, read `limit` at a time
    from the first page to the last (whose `next_cursor` is null)."""
    await eventually(
        lambda: c.get(url),
        lambda r: r.status_code == 200 and len(r.json()["items"]) == count,
        what=f"{count} items at {url}",
    )
    items: list[Any] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        page = ok(await c.get(url, params=params))
        items += page["items"]
        if page["next_cursor"] is None:
            return items
        params["cursor"] = page["next_cursor"]


async def publish_chunk(stack: Stack, world: World, text: str) -> None:
    """A live chunk of the world's session, as a runner's broker would publish it."""
    chunk = LiveChunk(
        session_id=world.session_id,
        activation_id="act-1",
        kind="text",
        text=text,
        at=datetime.now(UTC),
    )
    await stack.nc.jetstream().publish(
        stack.topology.live_subject(world.session_id), chunk.model_dump_json().encode()
    )


async def lose_kept_answer(stack: Stack, caller_key: str, path: str, idempotency_key: str) -> None:
    """Delete the answer the gateway kept for a request under `idempotency_key` (as a command
    that timed out after it was applied leaves it: its answer is never kept). The slot named
    as the gateway names it (its caller's key, its path, the key), and waited for: the answer
    is kept as the response goes out, and may land a moment after the client has it — taking
    "the slot that came" instead took a slot a request before kept late."""
    slot = hashlib.sha256(
        b"\n".join([caller_key.encode(), path.encode() + b"?", idempotency_key.encode()])
    ).hexdigest()
    kv = await stack.nc.jetstream().key_value(stack.topology.bucket(IDEMPOTENCY_BUCKET))

    async def kept() -> bool:
        with contextlib.suppress(KeyNotFoundError):
            return (await kv.get(slot)).value is not None
        return False

    await eventually(kept, bool, what="the answer kept")
    await kv.delete(slot)
