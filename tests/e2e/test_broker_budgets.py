"""What one activation may spend through the tool-broker, against the real services (with small
budgets set as an operator would): its live output stops at its byte budget — LIVE is held in
the NATS server's memory — with one `state` chunk that says so, a start past its number of
tool calls is refused (each start is an event in the log for good), and so is a call past the
bytes it may write to the log otherwise (checkpoints, asks, history...), while another
activation keeps its own budgets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import pytest_asyncio
from nats.js.client import JetStreamContext

from suzumio.contracts.ids import new_id
from tests.e2e.conftest import PLATFORM_SERVICES
from tests.e2e.stack import Stack, running_stack
from tests.e2e.test_broker_access import activation_types, broker, live, start_body

LIVE_BUDGET = 6_000
MAX_CALLS = 3
LOG_BUDGET = 20_000


@pytest_asyncio.fixture(scope="module")
async def budgeted(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    env = {
        "SUZUMIO_LIVE_BYTES_PER_ACTIVATION": str(LIVE_BUDGET),
        "SUZUMIO_MAX_TOOL_CALLS_PER_ACTIVATION": str(MAX_CALLS),
        "SUZUMIO_LOG_BYTES_PER_ACTIVATION": str(LOG_BUDGET),
    }
    tmp = Path(tmp_path_factory.mktemp("budgeted"))
    async with running_stack(nats_url, postgres_url, tmp, PLATFORM_SERVICES, env) as s:
        yield s


def batch(n: int, text: str) -> dict[str, Any]:
    return {"batch": n, "chunks": [{"kind": "text", "text": text}]}


async def published(sub: JetStreamContext.PushSubscription) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    while True:
        try:
            msg = await sub.next_msg(timeout=1.0)
        except nats.errors.TimeoutError:
            return chunks
        chunks.append(json.loads(msg.data))


async def test_live_output_stops_at_the_activations_budget_and_says_so_once(
    budgeted: Stack,
) -> None:
    a = await live(budgeted, "loud")
    sub = await budgeted.nc.jetstream().subscribe(
        budgeted.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    async with broker(budgeted, a.token) as c:
        answers = [(await c.post("/runner/stream", json=batch(i, "x" * 2_000))) for i in range(4)]
        final = await c.post(
            "/activation-output", json={"text": "done", "live": batch(4, "the last words")}
        )
    # Each chunk is ~2.2 KB as published: two fit in 6,000 bytes, the third does not.
    assert [r.json() for r in answers] == [{"recorded": r} for r in (True, True, False, False)]
    assert final.json() == {"recorded": True}  # the output is recorded all the same
    chunks = await published(sub)
    await sub.unsubscribe()
    assert [(ch["kind"], len(ch["text"])) for ch in chunks[:2]] == [("text", 2_000)] * 2
    assert len(chunks) == 3, [ch["text"][:40] for ch in chunks]  # nothing after the notice
    notice = chunks[2]
    assert notice["kind"] == "state"
    assert notice["activation_id"] == a.activation_id
    assert notice["data"] == {"live_cut": True, "budget_bytes": LIVE_BUDGET}
    assert "activation.output_recorded" in await activation_types(budgeted, a.activation_id)

    other = await live(budgeted, "quiet")  # its own budget
    sub = await budgeted.nc.jetstream().subscribe(
        budgeted.topology.live_subject(other.world.session_id), ordered_consumer=True
    )
    async with broker(budgeted, other.token) as c:
        assert (await c.post("/runner/stream", json=batch(0, "hello"))).json() == {"recorded": True}
    assert [ch["text"] for ch in await published(sub)] == ["hello"]
    await sub.unsubscribe()


async def test_a_batch_sent_again_after_a_lost_answer_is_counted_once(budgeted: Stack) -> None:
    """Published once (its message ids), it was counted at every send: three sends of one
    2 KB batch after lost answers passed the 6,000-byte budget, and the live output was cut
    though it had published a third of it."""
    a = await live(budgeted, "again")
    sub = await budgeted.nc.jetstream().subscribe(
        budgeted.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    async with broker(budgeted, a.token) as c:
        sends = [await c.post("/runner/stream", json=batch(0, "x" * 2_000)) for _ in range(3)]
        sends.append(await c.post("/runner/stream", json=batch(1, "y" * 2_000)))
    assert [r.json() for r in sends] == [{"recorded": True}] * 4
    chunks = await published(sub)
    await sub.unsubscribe()
    assert [(ch["kind"], ch["text"][0]) for ch in chunks] == [("text", "x"), ("text", "y")]


async def test_a_start_past_the_activations_tool_calls_is_refused(budgeted: Stack) -> None:
    a = await live(budgeted, "busy")
    async with broker(budgeted, a.token) as c:
        for i in range(MAX_CALLS):
            answer = await c.post("/runner/tool-calls/start", json=start_body(f"c{i}"))
            assert answer.json() == {"recorded": True}
        again = await c.post("/runner/tool-calls/start", json=start_body("c0"))
        past = await c.post("/runner/tool-calls/start", json=start_body("c-last"))
        finish = {"call_id": "c0", "status": "ok", "duration_ms": 3, "result_size": 1}
        finished = await c.post("/runner/tool-calls/finish", json=finish)
    assert again.json() == {"recorded": False}  # a retry of one recorded is no new call
    assert past.status_code == 409, past.text
    assert past.headers["content-type"] == "application/problem+json"
    assert past.json()["code"] == "limit_reached"
    assert str(MAX_CALLS) in past.json()["detail"]
    assert finished.json() == {"recorded": True}  # its started calls still finish
    types = await activation_types(budgeted, a.activation_id)
    assert types.count("activation.tool_call_started") == MAX_CALLS

    other = await live(budgeted, "idle")
    async with broker(budgeted, other.token) as c:
        answer = await c.post("/runner/tool-calls/start", json=start_body("c0"))
    assert answer.json() == {"recorded": True}


async def test_a_call_past_the_activations_log_budget_is_refused(budgeted: Stack) -> None:
    """Each checkpoint (like each ask, history or support call) is an event in the log for
    good: a sandbox looping on them wrote on for as long as its token lasted. Past its budget
    (bytes of such calls, on each replica) a call is refused, what came before stays, and
    the output still goes — it is bounded on its own."""
    a = await live(budgeted, "hoarder")
    data = {"notes": "n" * 6_000}
    async with broker(budgeted, a.token) as c:
        first = {"checkpoint_id": new_id(), "data": data}
        saved = [await c.put("/runner/checkpoint", json=first)]
        # Sent again (its answer lost): written once, counted once.
        again = [await c.put("/runner/checkpoint", json=first) for _ in range(3)]
        saved += [
            await c.put("/runner/checkpoint", json={"checkpoint_id": new_id(), "data": data})
            for _ in range(3)
        ]
        supported = []
        for request_id in ("r1", "r2"):  # each counts 1 KiB at least
            signal = {"operation": "signal.record", "arguments": {}, "request_id": request_id}
            supported.append(await c.post("/toolpacks/core/support", json=signal))
        final = await c.post("/activation-output", json={"text": "done"})
    # ~6 KB each: three fit in 20,000 bytes, the fourth does not (and counts nothing); a small
    # call still fits in what is left, the next one no more.
    assert [r.json() for r in again] == [{"recorded": False}] * 3
    assert [r.status_code for r in saved] == [200, 200, 200, 409], saved[-1].text
    assert saved[3].json()["code"] == "limit_reached"
    assert str(LOG_BUDGET) in saved[3].json()["detail"]
    assert [r.status_code for r in supported] == [200, 409], supported[-1].text
    assert final.json() == {"recorded": True}
    stream = await budgeted.store.load("session", a.world.session_id)
    kept = [e for e in stream.events if e.envelope.type == "session.checkpoint_saved"]
    assert len(kept) == 3

    other = await live(budgeted, "thrifty")  # its own budget
    async with broker(budgeted, other.token) as c:
        answer = await c.put("/runner/checkpoint", json={"checkpoint_id": new_id(), "data": data})
    assert answer.json() == {"recorded": True}


def history_of(text: str) -> dict[str, Any]:
    return {"entries": [{"message_id": new_id(), "role": "assistant", "text": text}]}


async def test_calls_side_by_side_cannot_pass_the_log_budget_together(budgeted: Stack) -> None:
    """A call's bytes count from its check on, not once it has written: two history calls
    sent at once, each fitting the budget alone and not together, both passed the check
    while the other's append was on its way."""
    a = await live(budgeted, "racer")
    async with broker(budgeted, a.token) as c:
        answers = await asyncio.gather(
            *(c.post("/runner/history", json=history_of("h" * 12_000)) for _ in range(2))
        )
    assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
    stream = await budgeted.store.load("session", a.world.session_id)
    assert [e.envelope.type for e in stream.events].count("session.message_appended") == 1


async def test_a_refused_call_gives_its_bytes_back(budgeted: Stack) -> None:
    """A call the session refuses wrote nothing, and counts nothing: a compaction naming
    entries the session does not hold took its 15 KB of the budget for good, and the history
    call after it, which fits, was refused."""
    a = await live(budgeted, "refused")
    marker = {
        "marker_id": new_id(),
        "summary": "s" * 15_000,
        "archived_from": new_id(),
        "archived_through": new_id(),
    }
    async with broker(budgeted, a.token) as c:
        refused = await c.post("/runner/history/compaction", json=marker)
        after = await c.post("/runner/history", json=history_of("h" * 15_000))
    assert 400 <= refused.status_code < 500, refused.text
    assert refused.json()["code"] != "limit_reached", refused.text
    assert after.status_code == 200, after.text
