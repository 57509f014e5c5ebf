"""Files through the tool-broker (for sandboxes that share no disk with the platform, such as
Kubernetes Jobs): a token reads only its own session's artifacts, and what it sends back from
`/workspace/out` is recorded within the limits — through the broker's routes and through the
runner's own side of them (`suzumio.runner.handover`). Runs against the real session,
scheduler, tool-broker and gateway processes."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationCancelRequested
from suzumio.contracts.runner import FileExchange, InputFile
from suzumio.contracts.subjects import ARTIFACTS_BUCKET
from suzumio.platform.bus.objects import has_blob
from suzumio.runner.broker import BrokerClient, FencedError
from suzumio.runner.handover import fetch_inputs, send_outputs
from suzumio.runner.workfiles import ExchangeError
from tests.e2e.api import World, ok, problem, upload_artifact
from tests.e2e.stack import MAX_ARTIFACT, Stack
from tests.e2e.test_broker_access import broker, live
from tests.support import eventually


@asynccontextmanager
async def runner_client(platform: Stack, token: str) -> AsyncIterator[BrokerClient]:
    """The runner's own broker client, with the activation's token."""
    client = BrokerClient(platform.url_of("toolbroker"), token, retries=1)
    try:
        yield client
    finally:
        await client.aclose()


async def artifacts(stack: Stack, world: World) -> list[dict[str, Any]]:
    async with stack.client(world.key) as c:
        items: list[dict[str, Any]] = ok(await c.get(f"/v1/projects/{world.project_id}/artifacts"))[
            "items"
        ]
    return items


def input_file(item: dict[str, Any], **changes: Any) -> InputFile:
    fields = {k: item[k] for k in ("path", "sha256", "size")} | {"artifact_id": item["id"]}
    return InputFile(**(fields | changes))


async def test_a_token_reads_its_own_sessions_artifacts_and_no_other(platform: Stack) -> None:
    mine = await live(platform, "filea")
    theirs = await live(platform, "fileb")
    data = os.urandom(100_000)
    item = await upload_artifact(platform, mine.world, "data/blob.bin", data)
    async with broker(platform, mine.token) as c:
        got = await c.get(f"/runner/files/{item['id']}")
        assert got.status_code == 200
        assert got.content == data
        assert got.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
        problem(await c.get("/runner/files/no-such-artifact"), 404, "not_found")
    async with broker(platform, theirs.token) as c:  # another session's: as if it did not exist
        problem(await c.get(f"/runner/files/{item['id']}"), 404, "not_found")
    async with broker(platform, None) as c:
        assert (await c.get(f"/runner/files/{item['id']}")).status_code == 401
    async with platform.client(mine.world.key) as c:
        ok(await c.delete(f"/v1/artifacts/{item['id']}"), 204)
    async with broker(platform, mine.token) as c:
        await eventually(
            lambda: c.get(f"/runner/files/{item['id']}"),
            lambda r: r.status_code == 404,
            what="the deleted artifact refused",
        )


async def test_outputs_are_recorded_once_within_the_limits(platform: Stack) -> None:
    a = await live(platform, "outa")
    url = "/runner/files/out/{}"
    async with broker(platform, a.token) as c:
        first = await c.put(url.format(0), params={"path": "report/a.txt"}, content=b"one")
        assert ok(first) == {"recorded": True}
        again = await c.put(url.format(0), params={"path": "report/a.txt"}, content=b"one")
        assert ok(again) == {"recorded": False}  # a retry after a lost reply
        problem(await c.put(url.format(0), params={"path": "b.txt"}, content=b"2"), 409, "conflict")
        # Other bytes for a recorded index are refused before they are stored: no blob that
        # nothing references (and nothing collects) is left of them.
        other = os.urandom(64)
        refused = await c.put(url.format(0), params={"path": "report/a.txt"}, content=other)
        problem(refused, 409, "conflict")
        blobs = await platform.nc.jetstream().object_store(
            platform.topology.bucket(ARTIFACTS_BUCKET)
        )
        assert not await has_blob(blobs, hashlib.sha256(other).hexdigest())
        assert await has_blob(blobs, hashlib.sha256(b"one").hexdigest())
        # Two uploads of one index at once: one is recorded, the other refused unstored.
        racing = [os.urandom(64), os.urandom(64)]
        answers = await asyncio.gather(
            *(c.put(url.format(2), params={"path": "r.txt"}, content=b) for b in racing)
        )
        assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
        stored = [await has_blob(blobs, hashlib.sha256(b).hexdigest()) for b in racing]
        assert sorted(stored) == [False, True]
        problem(
            await c.put(url.format(200), params={"path": "c.txt"}, content=b"3"), 413, "too_many"
        )
        for bad in ("../x", "/etc/x", "a//b", "a\\b"):
            problem(await c.put(url.format(1), params={"path": bad}, content=b"4"), 422, "invalid")
        too_big = os.urandom(MAX_ARTIFACT + 1)
        problem(
            await c.put(url.format(1), params={"path": "big"}, content=too_big), 413, "too_large"
        )

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: refused while read
            for _ in range(3):
                yield os.urandom(MAX_ARTIFACT // 2)

        problem(
            await c.put(url.format(1), params={"path": "big"}, content=chunked()), 413, "too_large"
        )
    items = await eventually(
        lambda: artifacts(platform, a.world),
        lambda found: {"report/a.txt", "r.txt"} <= {i["path"] for i in found},
        what="the outputs as artifacts",
    )
    assert sorted((i["path"], i["source"], i["size"]) for i in items) == [
        ("r.txt", "activation", 64),
        ("report/a.txt", "activation", 3),
    ]
    await platform.store.append_next(
        a.world.session_id,
        [ActivationCancelRequested(activation_id=a.activation_id, reason="test")],
        EventMeta(actor="system:scheduler"),
    )
    async with broker(platform, a.token) as c:  # a cancelled activation sends nothing more
        late = await c.put(url.format(1), params={"path": "late.txt"}, content=b"late")
        assert late.status_code == 403, late.text


async def test_a_deleted_output_is_refused_again_before_its_bytes_are_stored(
    platform: Stack,
) -> None:
    """An output a person deleted while its activation still runs keeps its id for good: the
    sandbox sending other bytes for its index again is refused before they are read, so no
    blob that nothing references is left of each try (and none fills the object store)."""
    a = await live(platform, "outdel")
    url = "/runner/files/out/0"
    blobs = await platform.nc.jetstream().object_store(platform.topology.bucket(ARTIFACTS_BUCKET))
    async with broker(platform, a.token) as c:
        assert ok(await c.put(url, params={"path": "a.txt"}, content=b"first")) == {
            "recorded": True
        }
    [item] = await artifacts(platform, a.world)
    async with platform.client(a.world.key) as c:
        ok(await c.delete(f"/v1/artifacts/{item['id']}"), 204)
    async with broker(platform, a.token) as c:
        for attempt in range(3):
            other = os.urandom(64)
            refused = await c.put(url, params={"path": "a.txt"}, content=other)
            problem(refused, 409, "conflict")
            assert "deleted" in refused.json()["detail"], attempt
            assert not await has_blob(blobs, hashlib.sha256(other).hexdigest())
    assert await artifacts(platform, a.world) == []


async def test_the_runner_brings_inputs_in_and_sends_outputs_without_following_links(
    platform: Stack, tmp_path: Path
) -> None:
    a = await live(platform, "hand")
    brief = await upload_artifact(platform, a.world, "notes/brief.md", b"# brief\n")
    workspace = tmp_path / "workspace"
    client = BrokerClient(platform.url_of("toolbroker"), a.token, retries=1)
    try:
        files = FileExchange(
            inputs=(input_file(brief),), max_output_files=2, max_output_bytes=1_000
        )
        await fetch_inputs(client, workspace, files)
        assert (workspace / "in/notes/brief.md").read_bytes() == b"# brief\n"

        # Bytes that are not the artifact's are refused, and no partial file stays.
        wrong = FileExchange(inputs=(input_file(brief, path="other.md", size=3),))
        with pytest.raises(ExchangeError, match="not the artifact's"):
            await fetch_inputs(client, workspace, wrong)
        assert sorted(p.name for p in (workspace / "in").iterdir()) == ["notes"]

        # A directory of in/ that leads outside it (a link) fails the start.
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        (workspace / "in/linked").symlink_to(outside)
        linked = FileExchange(inputs=(input_file(brief, path="linked/brief.md"),))
        with pytest.raises(ExchangeError, match="outside"):
            await fetch_inputs(client, workspace, linked)
        assert list(outside.iterdir()) == []

        out = workspace / "out"
        (out / "deep").mkdir(parents=True)
        (out / "a.txt").write_text("alpha")
        (out / "deep/d.txt").write_text("over the count")
        (out / "b-huge.bin").write_bytes(b"x" * 1_001)  # over max_output_bytes: stays behind
        (out / "c.txt").write_text("gamma")
        secret = tmp_path / "host-secret"
        secret.write_text("the host's")
        (out / "leak.txt").symlink_to(secret)  # planted: never followed
        (out / "leakdir").symlink_to(tmp_path)
        assert await send_outputs(client, workspace, files) == 2
    finally:
        await client.aclose()
    items = await eventually(
        lambda: artifacts(platform, a.world),
        lambda found: len(found) == 3,
        what="the outputs as artifacts",
    )
    assert sorted((i["path"], i["size"]) for i in items if i["source"] == "activation") == [
        ("a.txt", 5),
        ("c.txt", 5),
    ]


async def test_an_output_over_the_brokers_own_limit_stays_behind_and_the_rest_go(
    platform: Stack, tmp_path: Path
) -> None:
    # The plan allows more than the broker does (two services, two settings): the broker
    # refuses the large file before reading it, and the runner, which writes a whole body
    # before it reads the answer, must still get that refusal, not a broken connection.
    a = await live(platform, "over")
    out = tmp_path / "out"
    out.mkdir()
    (out / "a-large.bin").write_bytes(os.urandom(MAX_ARTIFACT + (8 << 20)))
    (out / "b.txt").write_text("small")
    files = FileExchange(max_output_files=5, max_output_bytes=64 << 20)
    async with runner_client(platform, a.token) as client:
        assert await send_outputs(client, tmp_path, files) == 1
    items = await eventually(
        lambda: artifacts(platform, a.world),
        lambda found: len(found) == 1,
        what="the small output as an artifact",
    )
    assert [(i["path"], i["size"]) for i in items] == [("b.txt", 5)]


async def test_a_cancelled_runner_is_fenced_when_it_sends_outputs(
    platform: Stack, tmp_path: Path
) -> None:
    a = await live(platform, "fenc")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/a.txt").write_text("a")
    await platform.store.append_next(
        a.world.session_id,
        [ActivationCancelRequested(activation_id=a.activation_id, reason="test")],
        EventMeta(actor="system:scheduler"),
    )
    async with runner_client(platform, a.token) as client:
        with pytest.raises(FencedError):
            await send_outputs(
                client, tmp_path, FileExchange(max_output_files=5, max_output_bytes=9)
            )
    assert await artifacts(platform, a.world) == []
