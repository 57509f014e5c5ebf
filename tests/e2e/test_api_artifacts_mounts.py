"""Artifacts (streamed uploads, downloads) and mount grants through HTTP."""

from __future__ import annotations

import hashlib
import os
from typing import Any, cast

import httpx

from suzumio.contracts.subjects import ARTIFACTS_BUCKET, blob_name
from suzumio.gateway.api.routes.artifacts import attachment
from suzumio.platform.bus.objects import has_blob
from tests.e2e.api import lose_kept_answer, new_world, ok, problem, read_models_held
from tests.e2e.stack import MAX_UPLOAD, Stack

Part = tuple[str, tuple[str, bytes, str]]


async def test_upload_list_download_delete(stack: Stack) -> None:
    world = await new_world(stack, "ola")
    base = f"/v1/projects/{world.project_id}/artifacts"
    big = os.urandom(200 * 1024)
    files = [
        ("file", ("docs/readme.md", b"# hi\n", "text/markdown")),
        ("file", ("data/blob.bin", big, "application/octet-stream")),
        ("file", ("docs/copy.md", b"# hi\n", "text/markdown")),
    ]
    async with stack.client(world.key) as c:
        uploaded = ok(await c.post(base, files=files, data={"session_id": world.session_id}), 201)
        items = uploaded["items"]
        assert [i["path"] for i in items] == ["docs/readme.md", "data/blob.bin", "docs/copy.md"]
        assert items[1]["sha256"] == hashlib.sha256(big).hexdigest()
        assert items[0]["sha256"] == items[2]["sha256"]  # content-addressed: stored once
        assert {i["session_id"] for i in items} == {world.session_id}
        download = await c.get(f"/v1/artifacts/{items[1]['id']}/content")
        assert download.status_code == 200
        assert download.content == big
        assert download.headers["etag"] == f'"{items[1]["sha256"]}"'
        docs = ok(await c.get(base, params={"path_prefix": "docs/"}))
        assert sorted(i["path"] for i in docs["items"]) == ["docs/copy.md", "docs/readme.md"]
        by_session = ok(await c.get(base, params={"session_id": world.session_id}))
        assert len(by_session["items"]) == 3
        ok(await c.delete(f"/v1/artifacts/{items[0]['id']}"), 204)
        problem(
            await c.get(f"/v1/artifacts/{items[0]['id']}"),
            404,
            "not_found",
        )
        # The other artifact with the same bytes still downloads.
        assert (await c.get(f"/v1/artifacts/{items[2]['id']}/content")).content == b"# hi\n"


async def test_upload_errors(stack: Stack) -> None:
    world = await new_world(stack, "pam")
    base = f"/v1/projects/{world.project_id}/artifacts"
    async with stack.client(world.key) as c:
        too_big = os.urandom(MAX_UPLOAD + 1)
        problem(await c.post(base, files={"file": ("big.bin", too_big)}), 413, "too_large")
        for name in ("../escape.txt", "/etc/passwd", "a/../../b"):
            problem(await c.post(base, files={"file": (name, b"x")}), 422, "invalid")
        problem(
            await c.post(base, data={"session_id": world.session_id}, files={}),
            415,
            "unsupported_media_type",
        )
        problem(await c.post(base, json={"x": 1}), 415, "unsupported_media_type")
        problem(
            await c.post(base, files={"file": ("a.txt", b"x")}, data={"session_id": "ghost"}),
            422,
            "invalid",
        )
        theirs = await new_world(stack, "pia")
        secret = os.urandom(64)
        problem(
            await c.post(
                base, files={"file": ("a.txt", secret)}, data={"session_id": theirs.session_id}
            ),
            422,
            "invalid",
        )
        listed = ok(await c.get(base))
        assert listed["items"] == []  # nothing of the refused uploads was recorded
        blobs = await stack.nc.jetstream().object_store(stack.topology.bucket(ARTIFACTS_BUCKET))
        assert not await has_blob(blobs, hashlib.sha256(secret).hexdigest())


async def test_download_headers_are_safe_for_any_name_and_type(stack: Stack) -> None:
    world = await new_world(stack, "rex")
    base = f"/v1/projects/{world.project_id}/artifacts"
    name = "docs/résumé final;%.html"
    async with stack.client(world.key) as c:
        [item] = ok(
            await c.post(base, files={"file": (name, b"<script>1</script>", "text/html<x>")}),
            201,
        )["items"]
        assert item["content_type"] == "application/octet-stream"
        download = await c.get(f"/v1/artifacts/{item['id']}/content")
        assert download.status_code == 200
        disposition = download.headers["content-disposition"]
        assert disposition == (
            'attachment; filename="r_sum_ final;_.html";'
            " filename*=UTF-8''r%C3%A9sum%C3%A9%20final%3B%25.html"
        )
        assert attachment('a"b\\c.txt') == (
            "attachment; filename=\"a_b_c.txt\"; filename*=UTF-8''a%22b%5Cc.txt"
        )
        assert download.headers["x-content-type-options"] == "nosniff"
        assert download.headers["content-type"] == "application/octet-stream"
        [typed] = ok(
            await c.post(
                base, files={"file": ("a.json", b"{}", "Application/JSON; charset=utf-8")}
            ),
            201,
        )["items"]
        assert typed["content_type"] == "application/json"


async def test_a_download_whose_bytes_are_gone_is_a_404_before_anything_is_sent(
    stack: Stack,
) -> None:
    """The blob was looked up only as the body began: a 200 with its Content-Length went
    out, then the stream broke (an unhandled error in the log). Looked up first, it is a
    problem the client can read — as NATS in trouble there is a 503 to retry."""
    world = await new_world(stack, "gon")
    data = b"bytes that go missing"
    async with stack.client(world.key) as c:
        [item] = ok(
            await c.post(
                f"/v1/projects/{world.project_id}/artifacts",
                files={"file": ("gone.txt", data, "text/plain")},
                data={"session_id": world.session_id},
            ),
            201,
        )["items"]
        store = await stack.nc.jetstream().object_store(stack.topology.bucket(ARTIFACTS_BUCKET))
        await store.delete(blob_name(hashlib.sha256(data).hexdigest()))
        gone = problem(await c.get(f"/v1/artifacts/{item['id']}/content"), 404, "not_found")
        assert "bytes" in gone["detail"]


async def test_mount_grants_are_checked_against_the_allowed_roots(stack: Stack, tmp_path) -> None:
    world = await new_world(stack, "quin")
    base = f"/v1/projects/{world.project_id}/mount-grants"
    inside = stack.mount_root / f"data-{world.project_id}"
    inside.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (inside / "escape").symlink_to(outside)
    async with stack.client(world.key) as c:
        grant = ok(
            await c.post(base, json={"host_path": str(inside), "target": "/data", "mode": "rw"}),
            201,
        )
        assert (grant["host_path"], grant["mode"], grant["target"]) == (
            os.path.realpath(inside),
            "rw",
            "/data",
        )
        assert [g["id"] for g in ok(await c.get(base))] == [grant["id"]]
        problem(
            await c.post(base, json={"host_path": str(outside), "target": "/o"}), 403, "forbidden"
        )
        problem(
            await c.post(base, json={"host_path": str(inside / "escape"), "target": "/e"}),
            403,
            "forbidden",
        )
        problem(
            await c.post(base, json={"host_path": str(inside / "missing"), "target": "/m"}),
            422,
            "invalid",
        )
        problem(
            await c.post(base, json={"host_path": "relative/path", "target": "/m"}), 422, "invalid"
        )
        problem(
            await c.post(base, json={"host_path": str(inside), "target": "/workspace/x"}),
            422,
            "invalid",
        )
        problem(
            await c.post(base, json={"host_path": str(inside), "target": "/data"}), 409, "conflict"
        )
        ok(await c.delete(f"{base}/{grant['id']}"), 204)
        problem(await c.get(f"{base}/{grant['id']}"), 404, "not_found")
        problem(await c.delete(f"{base}/{grant['id']}"), 404, "not_found")


async def test_an_idempotency_key_tells_uploads_apart_by_their_files(stack: Stack) -> None:
    """Before, an upload's fingerprint was its path and length: another file of the same size
    under the same key got the first one's answer, and was never stored."""
    world = await new_world(stack, "ivo")
    base = f"/v1/projects/{world.project_id}/artifacts"
    headers = {"Idempotency-Key": f"up-{os.urandom(6).hex()}"}
    form = {"session_id": world.session_id}

    def files(data: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
        return [("file", ("notes.txt", data, "text/plain"))]

    async with stack.client(world.key) as c:
        first = await c.post(base, files=files(b"12345678"), data=form, headers=headers)
        assert first.status_code == 201, first.text
        other = await c.post(base, files=files(b"abcdefgh"), data=form, headers=headers)
        problem(other, 422, "invalid")
        # The same file again (a new multipart boundary, as every client draws): a replay.
        again = await c.post(base, files=files(b"12345678"), data=form, headers=headers)
        assert again.status_code == 201, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        listed = ok(await c.get(base))  # an upload answers once its artifacts are listed
    assert [i["sha256"] for i in listed["items"]] == [hashlib.sha256(b"12345678").hexdigest()]


async def _recorded_alone_then_answer_lost(
    stack: Stack, c: httpx.AsyncClient, base: str, first: Part, headers: dict[str, str]
) -> dict[str, Any]:
    """What an upload that failed half-way under `headers`' Idempotency-Key leaves: its first
    file recorded (through the route, under the artifact id derived from the key), and no
    answer kept for the key — a timed-out command's answer never is, nor a 503's, nor one the
    gateway died before keeping. Simulated by uploading the first file alone under the key
    (the ids derived from a key do not depend on the files) and deleting the answer kept."""
    recorded = ok(await c.post(base, files=[first], headers=headers), 201)
    caller = c.headers["authorization"].removeprefix("Bearer ")
    await lose_kept_answer(stack, caller, base, headers["Idempotency-Key"])
    [item] = recorded["items"]
    return cast("dict[str, Any]", item)


async def test_an_upload_retried_with_its_key_after_failing_half_way_is_completed(
    stack: Stack,
) -> None:
    """Before, the retry got the 409 of its first file (recorded by the first attempt) and the
    rest were never recorded; now the retry goes on past it and answers as the first attempt
    would have."""
    world = await new_world(stack, "half")
    base = f"/v1/projects/{world.project_id}/artifacts"
    headers = {"Idempotency-Key": f"up-{os.urandom(6).hex()}"}
    readme: Part = ("file", ("docs/readme.md", b"# hi\n", "text/markdown"))
    blob: Part = ("file", ("data/blob.bin", os.urandom(4096), "application/octet-stream"))
    async with stack.client(world.key) as c:
        first = await _recorded_alone_then_answer_lost(stack, c, base, readme, headers)
        retried = await c.post(base, files=[readme, blob], headers=headers)
        items = ok(retried, 201)["items"]
        assert "idempotent-replayed" not in retried.headers
        assert [i["path"] for i in items] == ["docs/readme.md", "data/blob.bin"]
        assert items[0] == first  # the file the first attempt recorded, not a second one
        assert (await c.get(f"/v1/artifacts/{items[1]['id']}/content")).content == blob[1][1]
        # Its answer is kept now: the same upload again is a replay of it.
        again = await c.post(base, files=[readme, blob], headers=headers)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == retried.json()
        listed = ok(await c.get(base))
    assert sorted(i["id"] for i in listed["items"]) == sorted(i["id"] for i in items)


async def test_an_upload_retried_while_the_read_models_lag_is_not_kept_unfinished(
    stack: Stack,
) -> None:
    """The first attempt recorded its first file and its answer was lost; the retry cannot
    tell yet whether that file is the one it sends, as the read models stand still (the
    projector's checkpoint held here). Before, that was a 504 — kept for the key, so every
    later retry got it and the rest of the files were never recorded. Now a 503, kept for
    nothing: the next retry completes the upload."""
    world = await new_world(stack, "halflag")
    base = f"/v1/projects/{world.project_id}/artifacts"
    headers = {"Idempotency-Key": f"up-{os.urandom(6).hex()}"}
    readme: Part = ("file", ("docs/readme.md", b"# lag\n", "text/markdown"))
    blob: Part = ("file", ("data/lag.bin", os.urandom(2048), "application/octet-stream"))
    async with stack.client(world.key) as c:
        async with read_models_held(stack):
            # The first file recorded; the answer (a 504 here) lost with the gateway.
            problem(await c.post(base, files=[readme], headers=headers), 504, "timeout")
            await lose_kept_answer(stack, world.key, base, headers["Idempotency-Key"])
            lagged = await c.post(base, files=[readme, blob], headers=headers)
        problem(lagged, 503, "unavailable")
        assert "retry-after" in lagged.headers
        retried = await c.post(base, files=[readme, blob], headers=headers)
        items = ok(retried, 201)["items"]
        listed = ok(await c.get(base))
    assert "idempotent-replayed" not in retried.headers
    assert [i["path"] for i in items] == ["docs/readme.md", "data/lag.bin"]
    assert sorted(i["id"] for i in listed["items"]) == sorted(i["id"] for i in items)


async def test_an_upload_retried_with_its_key_but_other_files_is_still_a_conflict(
    stack: Stack,
) -> None:
    """The retry sends another file (the same path, other bytes) where the first attempt
    recorded one: not the first attempt's work, so a conflict, and nothing of it recorded."""
    world = await new_world(stack, "halfother")
    base = f"/v1/projects/{world.project_id}/artifacts"
    headers = {"Idempotency-Key": f"up-{os.urandom(6).hex()}"}
    readme: Part = ("file", ("docs/readme.md", b"# hi\n", "text/markdown"))
    changed: Part = ("file", ("docs/readme.md", b"# ho\n", "text/markdown"))
    blob: Part = ("file", ("data/blob.bin", os.urandom(4096), "application/octet-stream"))
    async with stack.client(world.key) as c:
        first = await _recorded_alone_then_answer_lost(stack, c, base, readme, headers)
        problem(await c.post(base, files=[changed, blob], headers=headers), 409, "conflict")
        listed = ok(await c.get(base))
    assert listed["items"] == [first]
