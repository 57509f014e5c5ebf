"""A pool worker's file exchange through the artifacts' object store (real NATS): inputs
brought into `in/` byte for byte, outputs stored content-addressed within the limits, and
nothing a sandbox plants (links out of its workspace) makes the worker read or write outside
it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js.object_store import ObjectStore

from suzumio.contracts.runner import FileRef
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology, blob_name
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.runner.exchange import ExchangeError, bring_in, bring_out
from suzumio.runner.workfiles import holds_nothing


async def objects(nc: NATS, topology: Topology) -> ObjectStore:
    return await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))


async def stored(store: ObjectStore, data: bytes, path: str) -> FileRef:
    digest = hashlib.sha256(data).hexdigest()
    await store.put(blob_name(digest), data)
    return FileRef(path=path, sha256=digest, size=len(data))


async def test_inputs_land_at_their_paths(nc: NATS, topology: Topology, tmp_path: Path) -> None:
    store = await objects(nc, topology)
    big = os.urandom(300_000)  # several chunks
    refs = (await stored(store, b"hello\n", "a.txt"), await stored(store, big, "deep/er/b.bin"))
    inbox = tmp_path / "in"
    await bring_in(store, inbox, refs)
    assert (inbox / "a.txt").read_bytes() == b"hello\n"
    assert (inbox / "deep/er/b.bin").read_bytes() == big
    assert sorted(p.name for p in (inbox / "deep/er").iterdir()) == ["b.bin"]  # no partials

    # A warm workspace keeps a file with exactly those bytes; one the agent changed — even to
    # the same size — is fetched again.
    kept = (inbox / "deep/er/b.bin").stat().st_ino
    (inbox / "a.txt").write_bytes(b"HELLO\n")
    await bring_in(store, inbox, refs)
    assert (inbox / "a.txt").read_bytes() == b"hello\n"
    assert (inbox / "deep/er/b.bin").stat().st_ino == kept  # not fetched again
    (inbox / "deep/er/b.bin").write_bytes(b"short")
    await bring_in(store, inbox, refs)
    assert (inbox / "deep/er/b.bin").read_bytes() == big


async def test_a_missing_input_or_a_planted_link_is_an_error(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    store = await objects(nc, topology)
    inbox = tmp_path / "in"
    missing = FileRef(path="gone.txt", sha256="ab" * 32, size=3)
    with pytest.raises(ExchangeError, match=r"gone\.txt"):
        await bring_in(store, inbox, (missing,))
    assert not (inbox / "gone.txt").exists()

    # An earlier activation left `in/docs` as a link to a directory outside the workspace.
    outside = tmp_path / "outside"
    outside.mkdir()
    (inbox / "docs").symlink_to(outside)
    ref = await stored(store, b"data", "docs/x.txt")
    with pytest.raises(ExchangeError, match="outside"):
        await bring_in(store, inbox, (ref,))
    deeper = await stored(store, b"data", "docs/made/x.txt")  # no directory made through it
    with pytest.raises(ExchangeError, match="outside"):
        await bring_in(store, inbox, (deeper,))
    assert list(outside.iterdir()) == []

    # Or left `in` itself as a link out of the workspace.
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "in").symlink_to(outside)
    for path in ("x.txt", "sub/x.txt"):
        with pytest.raises(ExchangeError, match="outside"):
            await bring_in(store, workspace / "in", (await stored(store, b"data", path),))
    assert list(outside.iterdir()) == []


async def test_a_planted_fifo_is_replaced_not_waited_on(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    """An earlier activation of a warm workspace left a FIFO where this one's input goes:
    opened to see whether it already holds the input's bytes, it held the worker until a
    writer came — for ever."""
    store = await objects(nc, topology)
    inbox = tmp_path / "in"
    inbox.mkdir()
    os.mkfifo(inbox / "a.txt")
    ref = await stored(store, b"hello\n", "a.txt")
    try:
        await asyncio.wait_for(bring_in(store, inbox, (ref,)), 10)
    finally:  # a reader stuck in open() gets its writer, so no thread is left hanging
        with contextlib.suppress(OSError):
            os.close(os.open(inbox / "a.txt", os.O_WRONLY | os.O_NONBLOCK))
    assert (inbox / "a.txt").read_bytes() == b"hello\n"


async def test_outputs_are_stored_and_the_outbox_emptied(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    store = await objects(nc, topology)
    outbox = tmp_path / "out"
    (outbox / "sub").mkdir(parents=True)
    (outbox / "report.md").write_bytes(b"# report\n")
    (outbox / "sub" / "data.csv").write_bytes(b"a,b\n1,2\n")
    (outbox / "huge.bin").write_bytes(b"x" * 2_000)
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"the worker's own file")
    (outbox / "leak.txt").symlink_to(secret)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "more.txt").write_bytes(b"not the sandbox's")
    (outbox / "linked-dir").symlink_to(tmp_path / "elsewhere")

    refs = await bring_out(store, outbox, max_files=10, max_bytes=1_000)

    assert [(r.path, r.size) for r in refs] == [("report.md", 9), ("sub/data.csv", 8)]
    for ref, data in zip(refs, (b"# report\n", b"a,b\n1,2\n"), strict=True):
        assert ref.sha256 == hashlib.sha256(data).hexdigest()
        assert (await store.get(blob_name(ref.sha256))).data == data
    assert list(outbox.iterdir()) == []  # a warm workspace does not hand them in again
    assert secret.read_bytes() == b"the worker's own file"  # links removed, not followed
    assert (tmp_path / "elsewhere" / "more.txt").exists()


async def test_an_outbox_with_no_file_is_still_emptied_and_given_back_its_mode(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    """The check that skips an empty outbox (no walk, no thread) must not skip one holding
    only directories, a link or a locked-up mode: those are put right as before."""
    store = await objects(nc, topology)
    outbox = tmp_path / "out"
    (outbox / "a" / "b").mkdir(parents=True)
    (outbox / "link").symlink_to(tmp_path)
    assert await bring_out(store, outbox, max_files=10, max_bytes=1_000) == ()
    assert list(outbox.iterdir()) == []
    assert tmp_path.exists()

    outbox.chmod(0o000)  # what `chmod 000 out` leaves: nothing in it, no way in for its owner
    assert await bring_out(store, outbox, max_files=10, max_bytes=1_000) == ()
    assert outbox.stat().st_mode & 0o700 == 0o700

    assert await bring_out(store, outbox, max_files=10, max_bytes=1_000) == ()  # empty: as is
    assert await bring_out(store, tmp_path / "none", max_files=10, max_bytes=1_000) == ()


def test_nothing_is_held_by_no_directory_or_an_empty_one_its_owner_can_change(
    tmp_path: Path,
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    for held_nothing in ("empty", "file", "link", "missing"):
        assert holds_nothing(tmp_path / held_nothing), held_nothing
    (tmp_path / "with-dir" / "d").mkdir(parents=True)
    (tmp_path / "with-file").mkdir()
    (tmp_path / "with-file" / ".hidden").write_bytes(b"")
    (tmp_path / "locked").mkdir(mode=0o500)
    for holding in ("with-dir", "with-file", "locked"):
        assert not holds_nothing(tmp_path / holding), holding


async def test_outputs_beyond_the_count_are_left_out(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    store = await objects(nc, topology)
    outbox = tmp_path / "out"
    outbox.mkdir()
    for i in range(5):
        (outbox / f"f{i}.txt").write_text(f"file {i}")
    refs = await bring_out(store, outbox, max_files=3, max_bytes=1_000)
    assert [r.path for r in refs] == ["f0.txt", "f1.txt", "f2.txt"]
    assert list(outbox.iterdir()) == []
    (outbox / "kept.txt").write_text("no collection asked for")
    assert await bring_out(store, outbox, max_files=0, max_bytes=1_000) == ()
    assert (outbox / "kept.txt").exists()


# A pool worker stores the bytes of an output it hashed, not what the file holds by the time it
# is uploaded: a process of the sandbox that changes the file in between (one that outlived its
# activation in a warm workspace) put other bytes under that digest — a blob that every later
# upload of the right bytes, from any project, takes as stored.


class ChangedOnTheWay:
    """The object store, but the file changes as the worker looks the digest up."""

    def __init__(self, store: ObjectStore, file: Path) -> None:
        self.store = store
        self.file = file

    async def get_info(self, name: str) -> object:
        self.file.write_bytes(b"other bytes, written while the first ones were stored")
        return await self.store.get_info(name)

    async def put(self, name: str, data: object) -> object:
        return await self.store.put(name, data)  # type: ignore[arg-type]


async def test_the_bytes_stored_are_the_bytes_hashed(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    store = await objects(nc, topology)
    outbox = tmp_path / "out"
    outbox.mkdir()
    first = b"the report as the activation left it " + tmp_path.name.encode()
    (outbox / "report.md").write_bytes(first)
    racing = ChangedOnTheWay(store, outbox / "report.md")
    [ref] = await bring_out(racing, outbox, max_files=10, max_bytes=10_000)  # type: ignore[arg-type]
    assert (ref.sha256, ref.size) == (hashlib.sha256(first).hexdigest(), len(first))
    assert (await store.get(blob_name(ref.sha256))).data == first


async def test_an_input_read_stopped_midway_leaves_no_subscription_behind(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    """A run cancelled while its inputs come in (or a write that fails): the chunks' ordered
    consumer goes with the read — nats-py's own `get` left it, with its tasks and the
    server's consumer, for the life of the worker's connection."""
    store = await objects(nc, topology)
    ref = await stored(store, os.urandom(24 * 1024 * 1024), "big.bin")
    inbox = tmp_path / "in"
    before = len(nc._subs)  # noqa: SLF001 - the connection's subscriptions
    bringing = asyncio.create_task(bring_in(store, inbox, (ref,)))

    def partly_written() -> bool:
        return any(p.is_file() and p.stat().st_size > 0 for p in tmp_path.rglob("*"))

    deadline = asyncio.get_running_loop().time() + 30
    while not partly_written() and not bringing.done():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.001)
    bringing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await bringing
    assert len(nc._subs) == before  # noqa: SLF001
