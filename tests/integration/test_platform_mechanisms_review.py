"""Review of the platform's shared mechanisms: leadership, settings, the object store."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js.object_store import ObjectStore

from suzumio.contracts.subjects import Topology, blob_name
from suzumio.platform.bus import connection, direct_get
from suzumio.platform.bus import objects as objects_module
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.bus.objects import (
    BlobDigestError,
    put_blob,
    read_chunks,
    sweep_stray_chunks,
)
from suzumio.platform.db import leadership
from suzumio.platform.db import pool as db
from suzumio.platform.db.leadership import Leadership


@contextlib.contextmanager
def _unreachable(port: int) -> Iterator[None]:
    """Every packet to or from local TCP port `port` dropped: a peer gone without a word (a
    host that lost power, a cut network), not a closed connection."""
    rules = [["INPUT", "-i", "lo", "-p", "tcp", flag, str(port), "-j", "DROP"]
             for flag in ("--sport", "--dport")]  # fmt: skip
    added = []
    try:
        for rule in rules:
            subprocess.run(["iptables", "-w", "-I", *rule], check=True, capture_output=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run(["iptables", "-w", "-D", *rule], check=False, capture_output=True)


async def _until(condition: Callable[[], bool], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.05)


def _can_drop_packets() -> bool:
    if shutil.which("iptables") is None:
        return False
    probe = subprocess.run(
        ["iptables", "-w", "-L", "INPUT", "-n"], check=False, capture_output=True
    )
    return probe.returncode == 0


async def test_a_leader_whose_host_vanished_does_not_hold_the_lock_for_hours(
    database_url: str,
) -> None:
    """The leader's peer disappears without closing its connection: Postgres must notice
    within seconds (TCP keepalives on the lock's connection), not after the kernel's
    default two hours, or no replica leads all that time. (Needs iptables, as root: the
    Docker engine the tests need brings it.)"""
    assert _can_drop_packets(), "iptables (as root) cuts the leader's connection here"
    first = Leadership(database_url, "vanish")
    first_stop = asyncio.Event()
    second = Leadership(database_url, "vanish")
    second_stop = asyncio.Event()

    async def lead(done: asyncio.Event) -> None:
        await done.wait()

    running = asyncio.create_task(first.run(first_stop, lead))
    admin = await db.connect(database_url, "observer")
    try:
        await _until(lambda: first.leading, 10)
        port = await admin.fetchval(
            "SELECT client_port FROM pg_stat_activity"
            " WHERE application_name = $1 AND datname = current_database()",
            "suzumio-leader-vanish",
        )
        assert port is not None
        with _unreachable(port):
            await _until(lambda: not first.leading, 10)  # it steps down by itself (heartbeat)
            first_stop.set()  # and stays away, as a dead host would
            await running
            contending = asyncio.create_task(second.run(second_stop, lead))
            try:
                await _until(lambda: second.leading, 45)
            finally:
                second_stop.set()
                await contending
    finally:
        first_stop.set()
        await running
        await admin.close()


async def test_a_peer_that_vanished_while_the_server_was_sending_is_noticed_in_seconds(
    database_url: str,
) -> None:
    """Keepalive probes are only sent on an idle connection: when the peer vanishes while the
    server still has data on its way (a heartbeat's answer, a notification), the kernel
    retransmits it for ~15 minutes instead, and the session keeps its locks all that time.
    `tcp_user_timeout` bounds that case too. Deterministic: the peer's packets are dropped
    first, then the server is made to send it something."""
    assert _can_drop_packets(), "iptables (as root) cuts the peer's connection here"
    peer = await db.connect(database_url, "suzumio-vanish-sending")
    admin = await db.connect(database_url, "observer")
    try:
        await peer.execute("LISTEN vanish_sending")
        row = await admin.fetchrow(
            "SELECT pid, client_port FROM pg_stat_activity"
            " WHERE application_name = $1 AND datname = current_database()",
            "suzumio-vanish-sending",
        )
        assert row is not None
        with _unreachable(row["client_port"]):
            await admin.execute("SELECT pg_notify('vanish_sending', repeat('x', 4000))")
            async with asyncio.timeout(40):  # 11 s from the last answer, and some slack
                while await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", row["pid"]
                ):
                    await asyncio.sleep(0.2)
    finally:
        peer.terminate()
        await admin.close()


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("SUZUMIO_HTTP_PORT", "eighty", "SUZUMIO_HTTP_PORT"),
        ("SUZUMIO_DB_POOL_MAX", "0", "SUZUMIO_DB_POOL_MAX"),
        ("SUZUMIO_BACKENDS", "docker", "backends"),  # not the JSON list the field takes
        ("SUZUMIO_DOCKER__MEMORY", "x", "SUZUMIO_DOCKER__MEMORY"),
        ("SUZUMIO_NAMESPACE", "Blue", "SUZUMIO_NAMESPACE"),  # no stream name can hold it
        ("SUZUMIO_SECRET_KEY", "hunter2-not-fernet", "SUZUMIO_SECRET_KEY"),  # never echoed
    ],
)
def test_a_service_with_a_wrong_setting_says_so_in_one_line(
    tmp_path: Path, variable: str, value: str, named: str
) -> None:
    """`python -m suzumio.<service>` with a wrong `SUZUMIO_*` value: one line naming the
    variable and exit 2 (as the CLI does), not a pydantic traceback."""
    env = {
        "PATH": "/usr/bin:/bin",
        "SUZUMIO_DATA_DIR": str(tmp_path / "data"),  # whatever happens, nothing starts here
        "SUZUMIO_NATS_URL": "nats://127.0.0.1:1",
        "SUZUMIO_DATABASE_URL": "postgresql://u:hunter2@127.0.0.1:1/x",
        variable: value,
    }
    ran = subprocess.run(
        [sys.executable, "-m", "suzumio.orchestrator"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == 2, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith("error: ")
    assert named in lines[0]
    assert "hunter2" not in ran.stderr


# -- the object store -------------------------------------------------------------------------

CHUNK = 128 * 1024  # nats-py's chunk size
DATA = bytes(range(256)) * (3 * CHUNK // 256) + b"tail"  # four chunks


@pytest_asyncio.fixture
async def blobs(nc: NATS, topology: Topology) -> AsyncIterator[tuple[ObjectStore, str]]:
    bucket = topology.bucket("blobs")
    store = await ensure_object_store(nc.jetstream(), bucket)
    yield store, bucket
    await nc.jetstream().delete_object_store(bucket)


async def _read(nc: NATS, store: ObjectStore, bucket: str, digest: str) -> bytes:
    return b"".join(
        [c async for c in read_chunks(nc.jetstream(), store, bucket, digest, timeout=3)]
    )


async def _stored_messages(nc: NATS, bucket: str) -> int:
    return (await nc.jetstream().stream_info(f"OBJ_{bucket}")).state.messages


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_blob_whose_bytes_are_not_its_name_is_not_served(
    nc: NATS, blobs: tuple[ObjectStore, str]
) -> None:
    """`sha256/<hex>` is trusted to hold the bytes of that digest: a later upload of those
    bytes is skipped as already stored. Bytes stored under another digest's name (by any
    client of the bucket: a pool worker hashes a sandbox's file and then reads it again to
    store it) must not be served as that digest's."""
    store, bucket = blobs
    wanted = b"the real bytes" * 100
    await store.put(blob_name(_digest(wanted)), io.BytesIO(b"something else" * 100))
    await put_blob(store, _digest(wanted), io.BytesIO(wanted))  # skipped: "already stored"
    with pytest.raises(OSError, match="corrupt"):
        await _read(nc, store, bucket, _digest(wanted))


async def test_a_put_of_bytes_that_are_not_its_digests_stores_nothing(
    nc: NATS, blobs: tuple[ObjectStore, str]
) -> None:
    """Recorded, the wrong bytes stood under the digest's name for good: every later put of
    the right ones found it stored and skipped. The put fails, its chunks go, and the right
    bytes are stored after it."""
    store, bucket = blobs
    with pytest.raises(BlobDigestError):
        await put_blob(store, _digest(DATA), io.BytesIO(b"not those bytes"))
    assert await _stored_messages(nc, bucket) == 0
    await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    assert await _read(nc, store, bucket, _digest(DATA)) == DATA


async def test_a_put_whose_stored_answer_was_lost_keeps_its_bytes(
    nc: NATS, blobs: tuple[ObjectStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object's record is stored but its acknowledgement is lost (a timeout): the bytes
    it names must stay. nats-py purges them then, leaving a record that names nothing, which
    every later put of the same bytes takes for stored."""
    store, bucket = blobs
    js: Any = store._js  # noqa: SLF001 - the connection nats-py stores through
    real = js.publish

    async def lossy(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        ack = await real(subject, payload, **kwargs)
        if f"$O.{bucket}.M." in subject:
            raise nats.errors.TimeoutError
        return ack

    monkeypatch.setattr(js, "publish", lossy)
    with contextlib.suppress(TimeoutError):
        await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    monkeypatch.undo()
    await put_blob(store, _digest(DATA), io.BytesIO(DATA))  # the caller's retry
    assert await _read(nc, store, bucket, _digest(DATA)) == DATA


async def test_a_put_whose_record_lands_after_its_timeout_keeps_its_bytes(
    nc: NATS, blobs: tuple[ObjectStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's publish times out and the record lands afterwards (held in the client
    across a reconnect, or still being agreed on in a cluster): the put found no record
    when it looked, purged its chunks, and the record that then landed named nothing — the
    blob broken for good, every later put of those bytes taking it for stored."""
    store, bucket = blobs
    js: Any = store._js  # noqa: SLF001 - the connection nats-py stores through
    real = js.publish
    late: list[asyncio.Task[Any]] = []

    async def slow_record(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        if f"$O.{bucket}.M." not in subject:
            return await real(subject, payload, **kwargs)

        async def land() -> Any:
            await asyncio.sleep(0.5)
            return await real(subject, payload, **kwargs)

        late.append(asyncio.create_task(land()))
        raise nats.errors.TimeoutError

    monkeypatch.setattr(js, "publish", slow_record)
    with pytest.raises(TimeoutError):
        await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    monkeypatch.undo()
    await asyncio.gather(*late)  # the record landed
    assert await _read(nc, store, bucket, _digest(DATA)) == DATA
    await put_blob(store, _digest(DATA), io.BytesIO(DATA))  # the caller's retry: stored
    assert await _stored_messages(nc, bucket) == 4 + 1  # the chunks of one copy, one record


async def test_a_slow_download_holds_a_few_chunks_not_the_blob(
    nc: NATS, nats_url: str, blobs: tuple[ObjectStore, str]
) -> None:
    """The chunks came on an ordered push consumer: the server sent them all while a slow
    client read (nats-py answers flow control as they arrive, not as they are taken), so each
    slow download held its whole blob in the process — 100 MB each, at the default limit."""
    store, bucket = blobs
    data = bytes(range(256)) * (100 * CHUNK // 256)  # 100 chunks, 12.5 MiB
    await put_blob(store, _digest(data), io.BytesIO(data))
    reader = await connection.connect(nats_url, "suzumio-test-download")
    try:
        before = reader.stats["in_bytes"]
        chunks = read_chunks(reader.jetstream(), store, bucket, _digest(data), timeout=5)
        first = await anext(chunks)
        await asyncio.sleep(1.0)  # a client that reads slowly: what arrives meanwhile
        arrived = reader.stats["in_bytes"] - before
        assert arrived <= 9 * CHUNK, f"{arrived} bytes came while one chunk was read"
        rest = b"".join([c async for c in chunks])
        assert first + rest == data
    finally:
        await reader.close()


async def test_a_put_whose_record_is_refused_takes_its_chunks_away(
    nc: NATS, blobs: tuple[ObjectStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal stored nothing: its chunks go at once, not left an hour for the sweep as
    those of a record whose fate is unknown are."""
    store, bucket = blobs
    js: Any = store._js  # noqa: SLF001 - the connection nats-py stores through
    real = js.publish

    async def refusing(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        if f"$O.{bucket}.M." in subject:
            raise nats.js.errors.APIError(code=400, err_code=10999, description="refused")
        return await real(subject, payload, **kwargs)

    monkeypatch.setattr(js, "publish", refusing)
    with pytest.raises(nats.js.errors.APIError):
        await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    assert await _stored_messages(nc, bucket) == 0


async def test_a_download_read_short_by_a_lagging_replica_reads_on(
    nc: NATS, blobs: tuple[ObjectStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica behind the rest ends the read short (a cluster's may): read on from one that
    holds the stream to its end, asked only then."""
    store, bucket = blobs
    await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    real = direct_get.iter_subject
    asked: list[int] = []

    async def lagging(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        asked.append(kwargs["min_last_seq"])
        served = 0
        async for stored in real(*args, **kwargs):
            if not kwargs["min_last_seq"] and served == 2:
                return  # the replica has no more
            served += 1
            yield stored

    monkeypatch.setattr(objects_module, "iter_subject", lagging)
    assert await _read(nc, store, bucket, _digest(DATA)) == DATA
    assert asked[0] == 0
    assert asked[1] > 0


class _Slow(io.RawIOBase):
    """`data`, whose first read waits on `gate` and whose later reads take `pause` each."""

    def __init__(self, data: bytes, gate: threading.Barrier | None, pause: float) -> None:
        self._data = io.BytesIO(data)
        self._gate = gate
        self._pause = pause
        self._first = True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._first:
            self._first = False
            if self._gate is not None:
                self._gate.wait(10)
        else:
            time.sleep(self._pause)
        return self._data.readinto(buffer)


async def test_concurrent_puts_of_one_blob_keep_one_copy(
    nc: NATS, blobs: tuple[ObjectStore, str]
) -> None:
    """Two puts of the same bytes at once (two uploads of one file): both find nothing
    stored; the second to finish must neither leave its chunks behind for ever nor purge
    the first one's (a download of it may be under way)."""
    store, bucket = blobs
    both = threading.Barrier(2)
    await asyncio.gather(
        *(put_blob(store, _digest(DATA), io.BufferedReader(_Slow(DATA, both, 0))) for _ in range(2))
    )
    assert await _read(nc, store, bucket, _digest(DATA)) == DATA
    assert (await store.get(blob_name(_digest(DATA)))).data == DATA  # as nats-py reads it
    assert await _stored_messages(nc, bucket) == 4 + 1  # the chunks of one copy, one record


async def test_a_put_cancelled_half_way_leaves_no_chunks(
    nc: NATS, blobs: tuple[ObjectStore, str]
) -> None:
    """A put cancelled after some chunks (a request or task cancelled at shutdown) must
    take them away: nothing names them, and nothing would ever remove them."""
    store, bucket = blobs
    putting = asyncio.create_task(
        put_blob(store, _digest(DATA), io.BufferedReader(_Slow(DATA, None, 0.5)))
    )
    async with asyncio.timeout(10):
        while await _stored_messages(nc, bucket) < 2:
            await asyncio.sleep(0.05)
    putting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await putting
    assert await _stored_messages(nc, bucket) == 0


async def test_a_blob_deleted_by_hand_is_stored_again(
    nc: NATS, blobs: tuple[ObjectStore, str]
) -> None:
    """An operator's `nats object rm` leaves a deleted record: the next put stores the bytes
    again over it (the put only refuses to replace a live blob)."""
    store, bucket = blobs
    await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    await store.delete(blob_name(_digest(DATA)))
    await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    assert await _read(nc, store, bucket, _digest(DATA)) == DATA


async def test_the_chunks_of_a_put_killed_half_way_are_swept_once_old(
    nc: NATS, blobs: tuple[ObjectStore, str]
) -> None:
    """A process killed between its chunks and its record leaves chunks no record names (its
    own cleanup never ran). The sweep purges them once nothing could still be writing them,
    and touches neither a stored blob nor a put under way."""
    store, bucket = blobs
    assert await sweep_stray_chunks(store, 0) == 0  # an empty store
    await put_blob(store, _digest(DATA), io.BytesIO(DATA))
    js = nc.jetstream()
    for chunk in (b"half", b"way"):  # what the killed put got written
        await js.publish(f"$O.{bucket}.C.KILLEDPUTNUID", chunk)
    before = await _stored_messages(nc, bucket)
    assert await sweep_stray_chunks(store, 3600) == 0  # as young as a put under way
    assert await _stored_messages(nc, bucket) == before
    assert await sweep_stray_chunks(store, 0) == 1
    assert await _stored_messages(nc, bucket) == before - 2
    assert await _read(nc, store, bucket, _digest(DATA)) == DATA
    assert await sweep_stray_chunks(store, 0) == 0


async def test_a_term_overdue_ends_before_another_replica_leads(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A term whose `lead` does not end when told is cancelled — and its cleanup (its
    `finally`) finished before the lock goes: another replica taking it at the cancel led
    beside the old term's last acts, which cleared the new term's state under it."""
    monkeypatch.setattr(leadership, "LEAD_END_SECONDS", 1.0)
    first = Leadership(database_url, "overdue")
    second = Leadership(database_url, "overdue", retry_seconds=0.05)
    first_stop, second_stop = asyncio.Event(), asyncio.Event()
    cleaned_at: list[float] = []
    led_at: list[float] = []

    async def deaf(done: asyncio.Event) -> None:  # noqa: ARG001 - told, it goes on
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.5)  # its cleanup: slow, and awaited
            cleaned_at.append(time.monotonic())

    async def lead(done: asyncio.Event) -> None:
        led_at.append(time.monotonic())
        await done.wait()

    running = asyncio.create_task(first.run(first_stop, deaf))
    await _until(lambda: first.leading, 10)
    contending = asyncio.create_task(second.run(second_stop, lead))
    try:
        first_stop.set()
        await running
        await _until(lambda: second.leading, 10)
        assert cleaned_at, "the overdue term's cleanup was cut short"
        assert led_at[0] >= cleaned_at[0]
    finally:
        first_stop.set()
        second_stop.set()
        await asyncio.gather(running, contending, return_exceptions=True)
