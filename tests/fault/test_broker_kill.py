"""SIGKILL the tool-broker while runners are mid-activation (their tool call audited, their
answer still on its way from the model, so the history and the output go to a broker that is
gone), and start it again on its port: the runners' retries carry them through, or the attempt
fails and is retried cleanly — every message done by exactly one completed activation (or
closed as failed), every activation in exactly one terminal state, no tool call audited twice,
no answer in the history twice, projections equal to a rebuild. All services are real
processes on the test NATS and Postgres; sandboxes run on the process backend; the model is the
scripted one (`suzumio.testing.model_server`, the fake provider)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio

from suzumio.testing.model_server import ScriptedModelServer
from tests.e2e.api import new_world
from tests.e2e.stack import Stack
from tests.fault.faultkit import (
    ANSWER,
    Posted,
    all_ended,
    messages_kept,
    no_audit_twice,
    no_output_twice,
    one_end_each,
    platform_at_work,
    post_until_acknowledged,
    projections_equal_a_rebuild,
    requested,
    restart,
    service,
    signals_settled,
    whole_log,
)
from tests.support import eventually

WORLDS = 3


@pytest_asyncio.fixture
async def stack(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Stack, ScriptedModelServer]]:
    async with platform_at_work(nats_url, postgres_url, tmp_path, answer_delay=1.5) as s:
        yield s


def unread_bytes(port: int) -> int:
    """What was sent to the server on `port` over its established connections and lies in
    their receive queues, unread (/proc/net/tcp: hex ports, state 01, tx:rx queues)."""
    unread = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, queues = fields[1], fields[3], fields[4]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01":
                    unread += int(queues.split(":")[1], 16)
    return unread


def answers_asked(model: ScriptedModelServer) -> int:
    """Model calls that carry a tool's result: the runner is waiting for its answer."""
    return sum(any(m.get("role") == "tool" for m in r.messages) for r in model.requests)


@pytest.mark.timeout(240)
async def test_a_tool_broker_killed_mid_activation_loses_nothing_and_repeats_nothing(
    stack: tuple[Stack, ScriptedModelServer],
) -> None:
    platform, model = stack
    worlds = [await new_world(platform, f"b{i}") for i in range(WORLDS)]
    posted = Posted()
    for i, world in enumerate(worlds):
        await post_until_acknowledged(platform, world, f"first {i}", posted)
    await eventually(
        lambda: asyncio.sleep(0, answers_asked(model)),
        lambda n: n >= 2,
        timeout=90,
        what="runners waiting for their answers",
    )
    first_wave = [a for world in worlds for a in await requested(platform, world)]
    broker = service(platform, "toolbroker")
    killed_at = datetime.now(UTC)
    broker.kill()  # their history and output now go to a broker that is gone
    await asyncio.sleep(1.0)
    await restart(broker)
    for i, world in enumerate(worlds):  # and later activations are served again
        await post_until_acknowledged(platform, world, f"second {i}", posted)
    assert not posted.unknown, posted

    signal_ids = [signal_id for _, signal_id in posted.acknowledged.values()]
    result = await signals_settled(platform, signal_ids, timeout=150)
    second = [posted.acknowledged[f"second {i}"][1] for i in range(WORLDS)]
    assert all(result.completed_deliveries(s) for s in second), "new work failed after the restart"
    ids = [a for world in worlds for a in await requested(platform, world)]
    one_end_each(await all_ended(platform, ids, timeout=60))
    envelopes = await whole_log(platform)
    messages_kept(envelopes, posted)
    no_output_twice(envelopes)
    no_audit_twice(envelopes)
    completed = {a for a, outcome in result.outcome_of.items() if outcome == "activation.completed"}
    answered = [
        str(e.data.get("activation_id"))
        for e in envelopes
        if e.type == "session.message_appended" and e.data.get("text") == ANSWER
    ]
    assert sorted(answered) == sorted(a for a in completed if a in ids), (answered, completed)
    # The kill did land mid-activation: runners that were waiting then recorded their output
    # through the broker started again.
    carried = [
        e.aggregate_id
        for e in envelopes
        if e.type == "activation.output_recorded"
        and e.aggregate_id in first_wave
        and e.occurred_at > killed_at
    ]
    assert carried, "no runner was mid-activation when the broker died"
    await projections_equal_a_rebuild(platform)


@pytest.mark.timeout(240)
async def test_a_broker_frozen_then_killed_while_it_takes_the_output_answers_it_once(
    stack: tuple[Stack, ScriptedModelServer],
) -> None:
    """The broker stops answering (SIGSTOP) while the runner waits for its model: the answer's
    history, its live output and the activation's output are then sent to a broker whose
    kernel accepts them and that never answers; then it dies (SIGKILL) and comes back. The
    runner sends them again, and the activation completes once, with its answer and its
    output once."""
    platform, model = stack
    world = await new_world(platform, "frozen")
    posted = Posted()
    await post_until_acknowledged(platform, world, "one", posted)
    [activation_id] = await eventually(
        lambda: requested(platform, world), lambda ids: len(ids) == 1, timeout=60, what="request"
    )
    await eventually(
        lambda: asyncio.sleep(0, answers_asked(model)),
        lambda n: n >= 1,
        timeout=90,
        what="the runner waiting for its answer",
    )
    broker = service(platform, "toolbroker")
    assert broker.process is not None
    stopped_at = datetime.now(UTC)
    broker.process.send_signal(signal.SIGSTOP)
    await eventually(  # the answer came meanwhile (1.5 s): the runner's calls hang
        lambda: asyncio.sleep(0, (model.in_flight, unread_bytes(broker.port))),
        lambda now: now[0] == 0 and now[1] > 0,
        timeout=60,
        what="the answer given and calls sent to the frozen broker (in flight, unread)",
    )
    broker.kill()  # a stopped process dies of SIGKILL all the same
    await restart(broker)

    [signal_id] = [s for _, s in posted.acknowledged.values()]
    result = await signals_settled(platform, [signal_id], timeout=120)
    [types] = await all_ended(platform, [activation_id], timeout=60)
    one_end_each([types])
    assert result.outcome_of[activation_id] == "activation.completed", types
    assert types.count("activation.output_recorded") == 1, types
    envelopes = await whole_log(platform)
    [output] = [e for e in envelopes if e.type == "activation.output_recorded"]
    assert output.occurred_at > stopped_at, "the output was in before the broker stopped"
    no_output_twice(envelopes)
    no_audit_twice(envelopes)
    await projections_equal_a_rebuild(platform)
