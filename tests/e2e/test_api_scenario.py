"""A scripted scenario of a few hundred API calls; afterwards rebuilding every projection
yields the same tables, and no secret appears where it must not."""

from __future__ import annotations

import random

import asyncpg
import httpx

from suzumio.contracts.values import PendingKind
from suzumio.platform import apikeys
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.base import live_schema
from suzumio.platform.projections.reader import LogReader
from suzumio.platform.projections.verify import verify
from tests.e2e.api import World, new_world, ok, tar_gz
from tests.e2e.stack import Stack
from tests.e2e.test_api_agents_sessions import AGENT_YAML
from tests.e2e.test_api_pending_stream import ask
from tests.support import eventually

PROVIDER_KEY = "sk-live-" + "9f8e7d6c5b4a3210" * 3


class Recorder:
    """Keeps every response body, except the one that shows a new API key once."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        self.calls = 0

    async def __call__(
        self,
        c: httpx.AsyncClient,
        method: str,
        url: str,
        *,
        shows_key: bool = False,
        **kwargs: object,
    ) -> httpx.Response:
        response = await c.request(method, url, **kwargs)  # type: ignore[arg-type]
        self.calls += 1
        assert response.status_code < 500, (method, url, response.text)
        if not shows_key:
            self.bodies.append(response.text + str(dict(response.headers)))
        return response


async def scenario(stack: Stack, call: Recorder) -> tuple[list[World], list[str]]:
    rng = random.Random(3)
    worlds = [await new_world(stack, f"user{i}") for i in range(3)]
    keys = [w.key for w in worlds]
    for w in worlds:
        async with stack.client(w.key) as c:
            base = f"/v1/projects/{w.project_id}"
            extra = await call(
                c,
                "POST",
                "/v1/me/api-keys",
                json={"name": "x"},
                shows_key=True,
                headers={"Idempotency-Key": f"key-{w.user_id}"},
            )
            keys.append(extra.json()["api_key"])
            await call(
                c,
                "PUT",
                f"{base}/providers/main",
                json={
                    "base_url": "https://llm.example.com/v1",
                    "model": "m",
                    "api_key": PROVIDER_KEY,
                },
            )
            await call(
                c,
                "PUT",
                f"{base}/runtime-profiles/docker",
                json={"backend": "docker", "image": "suzumio/runner"},
            )
            await call(
                c,
                "POST",
                f"{base}/agents/import",
                files={
                    "package": (
                        "p.tgz",
                        tar_gz({"agent.yaml": AGENT_YAML, "assets/a.txt": b"asset"}),
                    )
                },
            )
            root = stack.mount_root / f"scenario-{w.project_id}"
            root.mkdir()
            grant = await call(
                c, "POST", f"{base}/mount-grants", json={"host_path": str(root), "target": "/data"}
            )
            sessions = [w.session_id]
            for _ in range(4):
                s = await call(c, "POST", f"{base}/sessions", json={"agent_id": w.agent_id})
                sessions.append(s.json()["id"])
            for i in range(90):
                sid = rng.choice(sessions)
                roll = rng.random()
                if roll < 0.6:
                    await call(
                        c,
                        "POST",
                        f"/v1/sessions/{sid}/messages",
                        json={"text": f"message {i}", "priority": rng.choice(["P1", "P2"])},
                    )
                elif roll < 0.7:
                    await call(c, "POST", f"/v1/sessions/{sid}/signals", json={"payload": {"i": i}})
                elif roll < 0.8:
                    await call(
                        c,
                        "POST",
                        f"{base}/artifacts",
                        files={"file": (f"f{i}.txt", f"data {i}".encode())},
                        data={"session_id": sid},
                    )
                elif roll < 0.85:
                    await call(c, "POST", f"/v1/sessions/{sid}/close", json={"reason": "r"})
                    await call(c, "POST", f"/v1/sessions/{sid}/reopen")
                else:
                    await call(c, "GET", f"/v1/sessions/{sid}/messages")
            listed = await call(c, "GET", f"{base}/artifacts")
            for item in listed.json()["items"][:2]:
                await call(c, "DELETE", f"/v1/artifacts/{item['id']}")
            await call(c, "PATCH", f"/v1/agents/{w.agent_id}", json={"prompt": "new"})
            await call(c, "DELETE", f"{base}/mount-grants/{grant.json()['id']}")
        action = await ask(stack, w, PendingKind.QUESTION)
        async with stack.client(w.key) as c:
            await eventually(
                lambda: c.get(f"/v1/pending-actions/{action}"),  # noqa: B023
                lambda r: r.status_code == 200,
                what="pending action",
            )
            await call(c, "POST", f"/v1/pending-actions/{action}/reply", json={"answer": "sure"})
    return worlds, keys


async def test_api_scenario_rebuilds_equal_and_keeps_secrets(stack: Stack) -> None:
    call = Recorder()
    _, keys = await scenario(stack, call)
    assert call.calls >= 300  # "a few hundred API calls"

    # Rebuilding every projection from the log yields the same tables.
    last = await stream_last_seq(stack.nc, stack.topology.events_stream)
    async with stack.client(stack.admin_key) as c:
        ok(await c.get("/v1/me", params={"min_position": last}))
    projections = load_projections()
    results = await verify(stack.nc, stack.database_url, stack.topology, projections)
    assert [r.projection for r in results if not r.equal] == [], results

    # No provider key, and no API key, in plaintext anywhere it must not be.
    secrets = [PROVIDER_KEY, *keys, *(parsed[1] for k in keys if (parsed := apikeys.parse(k)))]
    places = {"responses": "\n".join(call.bodies)}
    places["logs"] = "\n".join(p.read_text(errors="replace") for p in stack.logs)
    places["events"] = await all_events(stack)
    places["tables"] = await all_rows(stack.database_url)
    places["idempotency"] = await all_kv(stack)
    for place, text in places.items():
        leaked = [s[:12] for s in secrets if s in text]
        assert leaked == [], f"secrets found in {place}: {leaked}"
    assert "api_key_set" in places["responses"]  # the scan did see provider answers


async def all_events(stack: Stack) -> str:
    chunks: list[str] = []
    async with LogReader(stack.nc, stack.topology, start_seq=1) as reader:
        while msgs := await reader.fetch(timeout=1.0):
            chunks += [m.data.decode() + str(m.headers) for m in msgs]
    assert chunks
    return "\n".join(chunks)


async def all_kv(stack: Stack) -> str:
    kv = await stack.nc.jetstream().key_value(stack.topology.bucket("idempotency"))
    values = [(await kv.get(k)).value or b"" for k in await kv.keys()]
    assert values
    return "\n".join(v.decode(errors="replace") for v in values)


async def all_rows(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE table_schema LIKE 'proj\\_%' OR table_schema = 'suzumio'"
        )
        rows = [
            r["j"]
            for t in tables
            for r in await conn.fetch(
                f'SELECT row_to_json(t)::text AS j FROM "{t["table_schema"]}"."{t["table_name"]}" t'
            )
        ]
    finally:
        await conn.close()
    assert live_schema("projects") in {t["table_schema"] for t in tables}
    return "\n".join(rows)
