"""SIGKILL the NATS server while activations run, and start it again on the same port and
store directory (as `suzumio up` does with its embedded server): every service reconnects by
itself, no acknowledged event is lost and none is in the log twice, every activation ends in
exactly one terminal state, every message is done once (or closed as failed), a message posted
during the outage by a client that sends it again is kept once, and the projections catch up
to equal a rebuild from the log. All services are real processes on their own NATS server
(embedded, from `suzumio.platform.embedded`) and the shared test Postgres; sandboxes run on the
process backend; the model is the scripted one (`suzumio.testing.model_server`, the fake
provider)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from suzumio.contracts.subjects import Storage
from suzumio.platform.embedded import RunningServer, start_nats
from suzumio.testing.model_server import ScriptedModelServer
from tests.e2e.api import World
from tests.e2e.stack import Stack
from tests.e2e.test_broker_access import broker, live
from tests.fault.faultkit import (
    Posted,
    TimelineWatcher,
    new_work_and_done_once,
    platform_at_work,
    post_until_acknowledged,
    under_way,
)
from tests.support import eventually

WORLDS = 4


class RestartableNats:
    """An embedded nats-server of this test's own (the session's shared one is not ours to
    kill), killed and started again on its port and store directory."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self.server: RunningServer = start_nats(store_dir, monitoring=False)
        self.url = self.server.url
        port = urlsplit(self.url).port
        assert port is not None
        self.port = port

    def kill(self) -> None:
        assert self.server.process is not None
        self.server.process.send_signal(signal.SIGKILL)
        self.server.process.wait()

    def start_again(self) -> None:
        self.server = start_nats(self.store_dir, port=self.port, monitoring=False)
        assert self.server.url == self.url

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[RestartableNats]:
    server = RestartableNats(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def stack(
    nats: RestartableNats, postgres_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Stack, ScriptedModelServer]]:
    async with platform_at_work(nats.url, postgres_url, tmp_path / "stack", 3.0) as s:
        yield s


@pytest.mark.timeout(240)
async def test_a_nats_server_killed_mid_run_and_started_again_loses_nothing(
    nats: RestartableNats, stack: tuple[Stack, ScriptedModelServer]
) -> None:
    platform, _ = stack
    worlds, posted = await under_way(platform, "n", WORLDS)

    await live_output_lost_is_trouble_not_a_failure(platform)
    async with TimelineWatcher(platform, worlds[0]) as watcher:  # an API client following along
        await eventually(
            lambda: asyncio.sleep(0, watcher.connected.is_set()),
            bool,
            timeout=30,
            what=f"the timeline stream (refused: {watcher.refusals[-3:]})",
        )
        nats.kill()  # mid-run: runners are between their tool call and their answer
        # A client posts while the server is away; it sends again until it is acknowledged.
        during = asyncio.create_task(post_until_acknowledged(platform, worlds[0], "during", posted))
        await asyncio.sleep(2.0)
        nats.start_again()
        await during
        await finish_checks(platform, worlds, posted, watcher)


async def finish_checks(
    platform: Stack, worlds: list[World], posted: Posted, watcher: TimelineWatcher
) -> None:
    assert "during" in posted.acknowledged, "the post was not taken after the restart"
    envelopes = await new_work_and_done_once(platform, worlds, posted)
    # The client following the timeline across the restart saw every event of the session.
    logged = [e.id for e in envelopes if e.aggregate_id == worlds[0].session_id]
    await eventually(
        lambda: asyncio.sleep(0, set(watcher.event_ids)),
        lambda seen: seen >= set(logged),
        timeout=30,
        what="the whole timeline on the reconnecting SSE stream",
    )
    assert set(watcher.event_ids) <= {e.id for e in envelopes}
    assert watcher.reconnects >= 1, "the stream did not notice the restart"


async def live_output_lost_is_trouble_not_a_failure(platform: Stack) -> None:
    """A restart loses the memory stream LIVE until the services make it again: a runner's
    live output meanwhile is answered 503 (retry), never 500 (the broker failing)."""
    a = await live(platform, "liveloss")
    [memory] = [s.name for s in platform.topology.streams() if s.storage is Storage.MEMORY]
    async with broker(platform, a.token) as c:
        for _ in range(5):
            await platform.nc.jetstream().delete_stream(memory)
            answer = await c.post(
                "/runner/stream", json={"chunks": [{"kind": "text", "text": "x"}]}
            )
            if answer.status_code != 200:  # 200: a service made it again in between
                break
        assert answer.status_code == 503, (answer.status_code, answer.text)
        assert answer.headers["retry-after"], answer.headers
