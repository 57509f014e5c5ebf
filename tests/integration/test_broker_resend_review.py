"""The tool-broker against a sandbox that resends what it sent, or sends what no runner would
(real NATS, the real registry, gate and app; the session service is a recorder):

- a live batch sent again under its number is published uncounted only when LIVE drops all of
  it as duplicates — no more chunks than the batch counted, within LIVE's duplicate window;
  more chunks under an old number are counted like a new batch, so the live budget holds;
- `approved_call` text nested past the JSON parser's limit, or `ask_user` arguments whose
  options the runner could not list, are refusals (4xx), not a 500;
- an output another replica recorded (its answer lost) is answered `recorded: false`.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.events import ActivationOutputRecorded
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import ToolPolicy
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import TokenSigner
from suzumio.toolbroker import routes
from suzumio.toolbroker.registry import ActivationRegistry, LiveActivation
from tests.integration.broker_world import KEY, SCHEDULER, Recorder, World, client, world


def chunks(count: int, size: int) -> list[dict[str, Any]]:
    return [{"kind": "text", "text": "x" * size} for _ in range(count)]


async def recorded(c: httpx.AsyncClient, batch: int, count: int, size: int) -> bool:
    """Whether a live batch of `count` chunks of `size` characters was published."""
    answer = await c.post("/runner/stream", json={"batch": batch, "chunks": chunks(count, size)})
    assert answer.status_code == 200, answer.text
    return bool(answer.json()["recorded"])


async def live_messages(nc: NATS, topology: Topology) -> int:
    info = await nc.jetstream().stream_info(topology.live_stream)
    return int(info.state.messages)


def with_policies(w: World, policies: dict[str, ToolPolicy]) -> str:
    return TokenSigner([KEY]).issue(
        activation_id=w.activation_id,
        session_id=w.session_id,
        project_id=w.project_id,
        agent_id=w.agent_id,
        ttl=timedelta(minutes=5),
        policies=policies,
    )


async def test_more_chunks_under_a_counted_batch_number_are_counted(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    """One small batch counted, then a thousand chunks sent under its number: before, they
    were taken for a retry — published, never counted — and a sandbox could fill the server's
    memory past any live budget. Now they count, and past the budget they are not published
    (the activation's live output is cut)."""
    w = await world(store)
    before = await live_messages(nc, topology)
    async with client(nc, topology, store, registry, Recorder(), w.token, live_budget=10_000) as c:
        assert await recorded(c, 0, 1, 10)
        # A true retry (its answer lost): the same chunks again, published, not counted.
        assert await recorded(c, 0, 1, 10)
        live = registry.get(w.activation_id)
        assert live is not None
        spent = live.live_bytes
        assert not await recorded(c, 0, 1_000, 100)
        assert live.live_bytes == spent
        assert live.live_cut
    # The first chunk, and the one chunk that says the live output stopped: nothing of the
    # thousand (the retry was a duplicate LIVE dropped).
    assert await live_messages(nc, topology) - before == 2


async def test_a_batch_number_sent_after_lives_window_counts_anew(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    registry: ActivationRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the time LIVE remembers a batch's message ids, its chunks are stored again if
    sent again: they are counted again too."""
    w = await world(store)
    async with client(nc, topology, store, registry, Recorder(), w.token, live_budget=10_000) as c:
        assert await recorded(c, 3, 2, 10)
        live = registry.get(w.activation_id)
        assert live is not None
        spent = live.live_bytes
        assert await recorded(c, 3, 2, 10)
        assert live.live_bytes == spent  # within the window: a retry
        monkeypatch.setattr(routes, "_live_window", lambda broker: 0.0)  # all forgotten
        assert await recorded(c, 3, 2, 10)
        assert live.live_bytes == 2 * spent


def nested_text(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("method", "path", "policies", "body"),
    [
        (
            "PUT",
            "/runner/checkpoint",
            {"checkpoint": ToolPolicy.ASK},
            {"checkpoint_id": "c1", "data": {"a": 1}, "approved_call": nested_text(50_000)},
        ),
        (
            "POST",
            "/runner/ask",
            {"ask_user": ToolPolicy.ASK},
            {"pending_action_id": "p1", "prompt": "q", "approved_call": nested_text(50_000)},
        ),
    ],
)
async def test_an_approved_call_nested_past_the_parser_is_a_422(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    registry: ActivationRegistry,
    method: str,
    path: str,
    policies: dict[str, ToolPolicy],
    body: dict[str, Any],
) -> None:
    w = await world(store)
    recorder = Recorder()
    async with client(nc, topology, store, registry, recorder, with_policies(w, policies)) as c:
        response = await c.request(method, path, json=body)
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "invalid"
    assert recorder.sent == []


@pytest.mark.parametrize("options", ["5", "2.5", "true"])
async def test_ask_arguments_whose_options_are_not_a_list_are_not_this_question(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry, options: str
) -> None:
    """The runner makes a question's options of a list; a number there is nothing it could
    have asked, so the approval it claims is not this question's: 409, not a 500."""
    w = await world(store)
    recorder = Recorder()
    token = with_policies(w, {"ask_user": ToolPolicy.ASK})
    written = f'{{"question": "q", "options": {options}}}'
    async with client(nc, topology, store, registry, recorder, token) as c:
        response = await c.post(
            "/runner/ask", json={"pending_action_id": "p1", "prompt": "q", "approved_call": written}
        )
        assert response.status_code == 409, response.text
        assert response.json()["code"] == "approval_required"
    assert recorder.sent == []


async def test_an_output_another_replica_recorded_is_answered_as_not_recorded_here(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    """Recorded by another replica, whose answer was lost: this one, asked again before it
    folded that, writes nothing and says so — `recorded: true` claimed this call's text was
    the one on record."""
    w = await world(store)
    async with client(nc, topology, store, registry, Recorder(), w.token) as c:
        known = await c.post("/runner/stream", json={"chunks": chunks(1, 1)})
        assert known.status_code == 200, known.text
        live = registry.get(w.activation_id)
        assert live is not None
        before = (live.logged, live.logged_seq)
        elsewhere = ActivationOutputRecorded(text="theirs", usage={}, reason="completed")
        stored = await store.append_next(w.activation_id, [elsewhere], SCHEDULER)
        assert await registry.folded.reached(stored.seq, 5.0)
        # As on a replica that has not folded it yet.
        live.output = False
        live.logged, live.logged_seq = before
        again = await c.post("/activation-output", json={"text": "mine"})
        assert again.status_code == 200, again.text
        assert again.json() == {"recorded": False}
    stream = await store.load("activation", w.activation_id)
    [output] = [e.data for e in stream.events]
    assert isinstance(output, ActivationOutputRecorded)
    assert output.text == "theirs"


def test_a_batch_counted_again_keeps_the_time_live_first_stored_its_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LIVE forgets an id a window after it stored it, whatever came again since. A batch
    counted again for a second chunk (20 s in) must not restart its clock: at 31 s LIVE has
    forgotten its first chunk's id, and two chunks under its number — the first now large —
    are stored again, so they count (they went uncounted while the clock restarted)."""
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # the clock routes reads
    a = LiveActivation("a1", "s1", "ag1", None)

    def send(chunks: int, size: int, at: float) -> bool | None:
        clock[0] = at
        return routes._counted(a, size, 1_000_000, 7, chunks, 30.0)

    assert send(1, 10, 0.0) is True
    assert send(1, 10, 5.0) is False  # a retry: LIVE drops it all
    assert send(2, 20, 20.0) is True  # a chunk LIVE does not know yet: counted
    assert send(2, 20, 22.0) is False  # within 25 s of the first chunk's storing
    assert send(2, 500_000, 31.0) is True  # the first chunk's id is forgotten: counted
    assert a.live_bytes == 10 + 20 + 500_000
    assert send(2, 20, 40.0) is False  # all stored anew at 31 s: a retry again
