"""The tool-broker's core under hostile input and races (real NATS, the real registry, gate and
app; the session service is a recorder of the commands it would get):

- free-form JSON a call brings (usage, checkpoint data, live data, support arguments) that the
  log could store but none of its readers parse back (nested past their recursion limit), or
  that no encoder writes out (a lone surrogate), is a 422 that changes nothing — never a stored
  event that makes the activation's subject unreadable, nor a 500;
- a cancel stored while the broker recalls an activation older than its look-back still fences
  it for every later call;
- a replica whose look-back holds no event starts at once and lets calls in;
- a checkpoint is at most 256 KB in bytes, as documented, not in characters;
- an output sent again after a cancel is answered as recorded if it was, else fenced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.events import (
    ActivationCancelRequested,
    CheckpointSaved,
    SessionMessageAppended,
    SessionOpened,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Author
from suzumio.platform.bus.eventstore import AggregateStream, EventStore, Head
from suzumio.toolbroker.pending import PendingWaiter
from suzumio.toolbroker.registry import ActivationRegistry
from suzumio.toolbroker.routes import MAX_ASKS_PER_ACTIVATION
from tests.integration.broker_world import (
    SCHEDULER,
    Recorder,
    World,
    client,
    world,
)
from tests.support import eventually


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def start_body(call_id: str) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool": "file.read",
        "arguments_digest": hashlib.sha256(b"{}").hexdigest(),
        "arguments_size": 2,
    }


async def test_an_output_no_reader_could_parse_back_is_refused(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    """220 levels: stored fine, but the log's readers parse with a recursion limit of 200, so
    the activation's whole subject would be unreadable (the orchestrator, the projector, the
    broker's own conflict path and registry)."""
    w = await world(store)
    async with client(nc, topology, store, registry, Recorder(), w.token) as c:
        response = await c.post(
            "/activation-output", json={"text": "done", "usage": {"a": nested(220)}}
        )
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "invalid"
        # The activation is untouched and can still say what it has to.
        fine = await c.post("/activation-output", json={"text": "done", "usage": {"a": 1}})
        assert fine.json() == {"recorded": True}
    stream = await store.load("activation", w.activation_id)
    assert [e.envelope.type for e in stream.events] == ["activation.output_recorded"]


async def test_an_output_too_large_for_the_bus_is_refused_before_its_history_is_written(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    """The final call's usage was bounded by nothing but the body's 32 MiB: its history went
    to the session and its live batch out, then its output event, too large for the bus, was
    refused — a refused call that had its effects, and one sent again and again wrote
    history each time, never charged to the log budget."""
    w = await world(store)
    commands = Recorder()
    entry = {"message_id": new_id(), "role": "assistant", "text": "the answer"}
    async with client(nc, topology, store, registry, commands, w.token) as c:
        refused = await c.post(
            "/activation-output",
            json={"text": "done", "usage": {"pad": "x" * 9_000_000}, "history": [entry]},
        )
        assert refused.status_code == 413, refused.text  # not 422: "a broker from before"
        assert refused.json()["code"] == "too_large"
        assert commands.sent == []  # no history appended
        fine = await c.post(
            "/activation-output", json={"text": "done", "usage": {"a": 1}, "history": [entry]}
        )
        assert fine.json() == {"recorded": True}
    assert [type(command).__name__ for command in commands.sent] == ["AppendHistory"]


async def test_the_final_calls_history_counts_against_the_log_budget(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    """As a history call's entries do: past the budget, nothing of the call is written."""
    w = await world(store)
    commands = Recorder()
    entry = {"message_id": new_id(), "role": "assistant", "text": "x" * 4_000}
    async with client(nc, topology, store, registry, commands, w.token, log_budget=3_000) as c:
        refused = await c.post("/activation-output", json={"text": "done", "history": [entry]})
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "limit_reached"
    assert commands.sent == []


LONE = '"\\ud800"'  # a lone surrogate, as JSON lets one be written
DEEP = "[" * 300 + "]" * 300  # past what the encoder writes out at all


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/runner/checkpoint", '{"checkpoint_id":"c1","data":{"a":@}}'.replace("@", DEEP)),
        ("PUT", "/runner/checkpoint", '{"checkpoint_id":"c1","data":{"a":@}}'.replace("@", LONE)),
        ("POST", "/runner/stream", '{"chunks":[{"kind":"text","data":{@:1}}]}'.replace("@", LONE)),
        ("POST", "/activation-output", '{"text":"x","usage":{"a":@}}'.replace("@", LONE)),
        ("POST", "/activation-output", '{"text":"x","usage":{"a":@}}'.replace("@", DEEP)),
        # In text that becomes an event: refused before any effect, not a 500 after the
        # history was appended and the live batch published.
        ("POST", "/activation-output", '{"text":@}'.replace("@", LONE)),
        (
            "POST",
            "/activation-output",
            '{"text":"done","history":[{"message_id":"m1","role":"assistant","text":@}],'
            '"live":{"batch":0,"chunks":[{"kind":"text","text":"d"}]}}'.replace("@", LONE),
        ),
        (
            "POST",
            "/runner/tool-calls/start",
            (
                '{"call_id":@,"tool":"t","arguments_digest":"' + "a" * 64 + '","arguments_size":1}'
            ).replace("@", LONE),
        ),
        (
            "POST",
            "/toolpacks/core/support",
            '{"operation":"signal.record","request_id":"r1","arguments":{"payload":{"a":@}}}'.replace(
                "@", DEEP
            ),
        ),
    ],
)
async def test_json_that_cannot_be_written_out_is_a_422_not_a_500(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    registry: ActivationRegistry,
    method: str,
    path: str,
    body: str,
) -> None:
    w = await world(store)
    recorder = Recorder()
    async with client(nc, topology, store, registry, recorder, w.token) as c:
        response = await c.request(
            method, path, content=body.encode(), headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert recorder.sent == []
    assert (await store.load("activation", w.activation_id)).events == ()


async def test_a_checkpoint_is_bounded_in_bytes_not_characters(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    w = await world(store)
    recorder = Recorder()
    async with client(nc, topology, store, registry, recorder, w.token) as c:
        # 100 000 characters, 400 000 bytes: over the documented 256 KB.
        big = {"checkpoint_id": "c1", "data": {"notes": "\U0001f600" * 100_000}}
        response = await c.put("/runner/checkpoint", json=big)
        assert response.status_code == 413, response.text
        small = {"checkpoint_id": "c2", "data": {"notes": "\U0001f600" * 60_000}}
        assert (await c.put("/runner/checkpoint", json=small)).status_code == 200
    assert [type(s).__name__ for s in recorder.sent] == ["SaveCheckpoint"]


class RacingStore(EventStore):
    """Stores a cancel of the activation while the broker reads the session's subject, and
    returns once the registry has folded it — the read itself was taken before."""

    def __init__(self, nc: NATS, topology: Topology) -> None:
        super().__init__(nc, topology)
        self.world: World | None = None
        self.registry: ActivationRegistry | None = None
        self.raced = False

    async def load(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AggregateStream:
        stream = await super().load(aggregate, aggregate_id, after=after, min_last_seq=min_last_seq)
        if aggregate == "session" and not self.raced and self.world is not None:
            assert self.registry is not None
            self.raced = True
            cancel = ActivationCancelRequested(activation_id=self.world.activation_id)
            stored = await self.append_next(self.world.session_id, [cancel], SCHEDULER)
            assert await self.registry.folded.reached(stored.seq, 5.0)
        return stream


async def test_a_cancel_stored_while_an_old_activation_is_recalled_fences_it(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    w = await world(store)  # requested before the look-back of the replica below
    await asyncio.sleep(0.2)
    await store.append(new_id(), [SessionOpened(project_id=new_id(), agent_id=new_id())], 0)
    registry = ActivationRegistry(nc, topology, timedelta(milliseconds=100))
    await registry.start()
    try:
        assert registry.get(w.activation_id) is None  # it must be recalled
        racing = RacingStore(nc, topology)
        racing.world, racing.registry = w, registry
        async with client(nc, topology, racing, registry, Recorder(), w.token) as c:
            # The call the cancel raced with may land (the documented window); no later one.
            await c.post("/runner/tool-calls/start", json=start_body("c1"))
            assert racing.raced
            late = await c.post("/runner/tool-calls/start", json=start_body("c2"))
            assert late.status_code == 403, late.text
            assert late.json()["code"] == "fenced"
            signal = await c.post(
                "/toolpacks/core/support",
                json={"operation": "signal.record", "arguments": {}, "request_id": "r1"},
            )
            assert signal.status_code == 403, signal.text
        stream = await store.load("activation", w.activation_id)
        assert [getattr(e.data, "call_id", "") for e in stream.events] in ([], ["c1"])
    finally:
        await registry.close()


async def test_a_replica_whose_look_back_holds_nothing_starts_at_once(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    w = await world(store)  # all the log holds is older than the look-back
    await asyncio.sleep(0.2)
    registry = ActivationRegistry(nc, topology, timedelta(milliseconds=100))
    began = time.monotonic()
    await registry.start()
    try:
        assert time.monotonic() - began < 10
        async with client(nc, topology, store, registry, Recorder(), w.token) as c:
            response = await c.post("/runner/tool-calls/start", json=start_body("c1"))
        assert response.json() == {"recorded": True}, response.text
    finally:
        await registry.close()


@pytest.mark.parametrize("folded", [True, False], ids=["folded_here", "not_folded_here"])
async def test_an_output_sent_again_after_a_cancel_is_answered_as_recorded(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry, folded: bool
) -> None:
    """The output was recorded and its answer lost; a cancel came before the runner sent it
    again. The runner must hear it is on record (it then exits as after its output, and the
    activation ends completed): a 403 made it exit as fenced, and the finished work ended
    cancelled, to be done again. On a replica that has not folded the output yet, the
    activation's subject says so. With no output on record, the fence holds."""
    w = await world(store)
    async with client(nc, topology, store, registry, Recorder(), w.token) as c:
        first = await c.post("/activation-output", json={"text": "done"})
        assert first.json() == {"recorded": True}, first.text
        cancel = ActivationCancelRequested(activation_id=w.activation_id, reason="asked")
        stored = await store.append_next(w.session_id, [cancel], SCHEDULER)
        assert await registry.folded.reached(stored.seq, 5.0)
        live = registry.get(w.activation_id)
        assert live is not None
        assert live.fenced
        if not folded:  # as a replica whose fold has not come to the output yet
            live.output = False
            live.logged, live.logged_seq = 0, 0
        again = await c.post("/activation-output", json={"text": "done"})
        assert again.status_code == 200, again.text
        assert again.json() == {"recorded": False}
        # Any other call is still fenced.
        late = await c.post("/runner/tool-calls/start", json=start_body("c1"))
        assert late.status_code == 403, late.text
    stream = await store.load("activation", w.activation_id)
    assert [e.envelope.type for e in stream.events] == ["activation.output_recorded"]


async def test_an_output_first_sent_after_a_cancel_is_fenced(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    w = await world(store)
    cancel = ActivationCancelRequested(activation_id=w.activation_id, reason="asked")
    stored = await store.append_next(w.session_id, [cancel], SCHEDULER)
    assert await registry.folded.reached(stored.seq, 5.0)
    async with client(nc, topology, store, registry, Recorder(), w.token) as c:
        response = await c.post("/activation-output", json={"text": "done"})
        assert response.status_code == 403, response.text
        assert response.json()["code"] == "fenced"
    assert not (await store.load("activation", w.activation_id)).events


class CountingStore(EventStore):
    """Counts the session events the broker reads back."""

    def __init__(self, nc: NATS, topology: Topology) -> None:
        super().__init__(nc, topology)
        self.read = 0

    async def load(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AggregateStream:
        stream = await super().load(aggregate, aggregate_id, after=after, min_last_seq=min_last_seq)
        if aggregate == "session":
            self.read += len(stream.events)
        return stream


async def test_the_latest_checkpoint_is_read_on_from_the_last_read_not_whole_each_time(
    nc: NATS, topology: Topology, registry: ActivationRegistry
) -> None:
    """An agent may ask for its session's checkpoint again and again: the session's history
    is read once, then only what came after (read whole each time, a long session had the
    broker decode every one of its events at each call)."""
    counting = CountingStore(nc, topology)
    w = await world(counting)
    author = Author(kind="user", id="u")
    entries = [
        SessionMessageAppended(message_id=new_id(), author=author, role="user", text=f"m{i}")
        for i in range(300)
    ]
    await counting.append_next(w.session_id, entries, SCHEDULER)
    saved = CheckpointSaved(checkpoint_id="c1", activation_id=w.activation_id, data={"n": 1})
    await counting.append_next(w.session_id, [saved], SCHEDULER)
    async with client(nc, topology, counting, registry, Recorder(), w.token) as c:
        counting.read = 0
        first = await c.get("/runner/checkpoint")
        assert first.json()["id"] == "c1", first.text
        assert counting.read > 300
        counting.read = 0
        for _ in range(3):
            again = await c.get("/runner/checkpoint")
            assert (again.json()["id"], again.json()["data"]) == ("c1", {"n": 1})
        assert counting.read == 0
        later = CheckpointSaved(checkpoint_id="c2", activation_id=w.activation_id, data={"n": 2})
        await counting.append_next(w.session_id, [later], SCHEDULER)
        newest = await c.get("/runner/checkpoint")
        assert (newest.json()["id"], newest.json()["data"]) == ("c2", {"n": 2})
        assert counting.read == 1


async def test_a_cancel_committed_beside_an_event_the_registry_cannot_read_still_fences(
    nc: NATS, store: EventStore, registry: ActivationRegistry
) -> None:
    """One commit, two events: one this release cannot read (a newer release's, mid-upgrade)
    and the cancel of this activation. The registry skipped the commit whole, and the
    activation it cancels acted on."""
    w = await world(store)
    cancel = ActivationCancelRequested(activation_id=w.activation_id, reason="asked")
    other = ActivationCancelRequested(activation_id=new_id(), reason="asked")
    prepared = await store.prepare(w.session_id, [other, cancel], 2, SCHEDULER)
    unreadable = json.loads(prepared.payload)
    unreadable[0]["data"] = {"activation_id": ["not", "an", "id"]}
    await store.commit(dataclasses.replace(prepared, payload=json.dumps(unreadable).encode()))

    assert await registry.fresh(store, w.session_id)
    live = registry.get(w.activation_id)
    assert live is not None
    assert live.fenced


async def test_an_activation_waits_on_a_few_asks_at_once(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    """Each ask may hold its request for minutes, and one asked again writes nothing new:
    nothing bounded how many a sandbox held open — a socket and a waiter each. Past the
    share, 503 (sent again after Retry-After); an ask that ended gives its place back."""
    w = await world(store)
    waiter = PendingWaiter(nc, topology, store)
    await waiter.start()
    try:
        async with client(nc, topology, store, registry, Recorder(), w.token, waiter=waiter) as c:

            async def ask(i: int, wait: float) -> httpx.Response:
                body = {"pending_action_id": f"q{i}", "prompt": "which?", "wait_seconds": wait}
                return await c.post("/runner/ask", json=body)

            waiting = [asyncio.create_task(ask(i, 30)) for i in range(MAX_ASKS_PER_ACTIVATION)]
            await eventually(
                lambda: asyncio.sleep(0, waiter._waiting),  # noqa: SLF001
                lambda held: len(held) == MAX_ASKS_PER_ACTIVATION,
                what="the asks waiting",
            )
            refused = await ask(99, 0)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            waiting.pop().cancel()
            await eventually(
                lambda: asyncio.sleep(0, waiter._waiting),  # noqa: SLF001
                lambda held: len(held) < MAX_ASKS_PER_ACTIVATION,
                what="a place given back",
            )
            assert (await ask(100, 0)).status_code == 200
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
    finally:
        await waiter.close()


async def test_an_activation_that_recorded_its_output_writes_nothing_more(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    """Its runner calls nothing after its output (its files go before it): a call now is a
    process the sandbox left behind (a shell command's background job, with the token it
    read), which wrote to the session until the activation's end was stored. The output sent
    again (its answer lost) is still answered."""
    w = await world(store)
    commands = Recorder()
    entry = {"message_id": new_id(), "role": "assistant", "text": "later"}
    async with client(nc, topology, store, registry, commands, w.token) as c:
        done = await c.post("/activation-output", json={"text": "done"})
        assert done.json() == {"recorded": True}
        late = await c.post("/runner/history", json={"entries": [entry]})
        assert late.status_code == 403, late.text
        assert late.json()["code"] == "fenced"
        again = await c.post("/activation-output", json={"text": "done"})
        assert again.json() == {"recorded": False}
    assert commands.sent == []
