"""Refusals the tool-broker finds only once a call is under way, which must still leave
nothing behind: an upload whose activation is cancelled while its body arrives, a command too
large for the bus (413, not a 500), and a query naming signals by what cannot be an id. Runs
against the real session, scheduler, tool-broker and gateway processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import nats.errors
import pytest

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationCancelRequested
from suzumio.contracts.ids import new_id
from suzumio.toolbroker.files import output_artifact_id
from tests.e2e.stack import Stack
from tests.e2e.test_broker_access import activation_types, broker, live, start_body
from tests.e2e.test_broker_limits import STEP, appended
from tests.support import eventually

BEYOND_THE_BUS = [  # 9 M characters: more than one NATS message carries (8 MB)
    {"message_id": new_id(), "role": "tool", "text": "x" * 1_000_000} for _ in range(9)
]


async def test_an_upload_cancelled_while_its_body_arrives_is_not_recorded(
    platform: Stack,
) -> None:
    a = await live(platform, "upfence")
    folded = asyncio.Event()

    async with broker(platform, a.token) as c, broker(platform, a.token) as other:

        async def body() -> AsyncIterator[bytes]:
            yield b"first half, "
            # The headers and the first chunk are in: the call is past its token check by now
            # (what the test shows by failing without the re-check), the body still to come.
            await asyncio.sleep(0.5)
            await platform.store.append_next(
                a.world.session_id,
                [ActivationCancelRequested(activation_id=a.activation_id, reason="test")],
                EventMeta(actor="system:scheduler"),
            )

            async def start() -> int:
                response = await other.post("/runner/tool-calls/start", json=start_body())
                return response.status_code

            await eventually(start, lambda code: code == 403, timeout=STEP, what="the fence")
            folded.set()
            yield b"second half"

        response = await c.put("/runner/files/out/0", params={"path": "a.txt"}, content=body())
    assert folded.is_set()
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "fenced"
    artifact = await platform.store.load("artifact", output_artifact_id(a.activation_id, 0))
    assert not artifact.events


async def test_history_too_large_for_the_bus_is_413_and_appends_nothing(platform: Stack) -> None:
    a = await live(platform, "bigh")
    async with broker(platform, a.token) as c:
        response = await c.post("/runner/history", json={"entries": BEYOND_THE_BUS})
    assert response.status_code == 413, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "too_large"
    assert await appended(platform, a.world.session_id) == []


async def test_a_final_call_whose_history_is_too_large_publishes_nothing(
    platform: Stack,
) -> None:
    """The history is the part of a final call that can be refused: refused, the call has
    published its live batch no more than recorded its output."""
    a = await live(platform, "bigf")
    sub = await platform.nc.jetstream().subscribe(
        platform.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    body = {
        "text": "done",
        "history": BEYOND_THE_BUS,
        "live": {"batch": 0, "chunks": [{"kind": "text", "text": "do"}]},
    }
    async with broker(platform, a.token) as c:
        response = await c.post("/activation-output", json=body)
    assert response.status_code == 413, response.text
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)
    await sub.unsubscribe()
    assert await appended(platform, a.world.session_id) == []
    assert await activation_types(platform, a.activation_id) == []


async def test_signals_received_by_what_is_not_an_id_is_422(platform: Stack) -> None:
    a = await live(platform, "sigq")
    async with broker(platform, a.token) as c:
        bad = await c.get("/runner/signals", params={"received": ["not an id"]})
        good = await c.get("/runner/signals", params={"received": [new_id()]})
    assert bad.status_code == 422, bad.text
    assert bad.headers["content-type"] == "application/problem+json"
    assert good.status_code == 200, good.text


async def test_an_activation_uploads_a_few_files_at_once(platform: Stack) -> None:
    """Its runner sends its outputs one at a time; a sandbox sending all its indexes at once
    had the broker hold every body (in memory, then on disk) together. Past a few at once,
    the next is put off before its body is read (503, Retry-After: a runner tries it again),
    and goes once one ends."""
    a = await live(platform, "upmany")
    let_go = asyncio.Event()
    body_of = [f"file {i}: done".encode() for i in range(5)]
    under_way = [asyncio.Event() for _ in range(4)]

    def held_back(index: int) -> AsyncIterator[bytes]:
        async def body() -> AsyncIterator[bytes]:
            yield body_of[index][:8]
            under_way[index].set()  # its head and first bytes are written: the next is asked
            await let_go.wait()
            yield body_of[index][8:]

        return body()

    async with broker(platform, a.token) as c:

        async def upload(index: int, content: Any) -> httpx.Response:
            return await c.put(
                f"/runner/files/out/{index}",
                params={"path": f"f{index}.txt"},
                content=content,
                headers={"Content-Length": str(len(body_of[index]))},
            )

        held = [asyncio.create_task(upload(i, held_back(i))) for i in range(4)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in under_way)), STEP)

        async def fifth() -> httpx.Response:
            return await upload(4, body_of[4])

        refused = await eventually(fifth, lambda r: r.status_code == 503, what="the refusal")
        assert refused.headers["retry-after"] == "1"
        let_go.set()
        answers = await asyncio.wait_for(asyncio.gather(*held), STEP)
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        again = await fifth()  # its turn now
        assert again.status_code == 200, again.text
