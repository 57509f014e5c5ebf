"""Review of the orchestrator's file exchange and workspace retention (real NATS object
store): a file name the session cannot hold, a name too long for the file system, a file
changed while it is stored, the store briefly in trouble, or a directory removed while the
retention sweep runs must each cost at most that one file (or that one directory) — never
the session's other files, every later activation of the session, or the sweep itself."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any, Self, cast

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.object_store import ObjectStore

from suzumio.contracts.errors import CommandTimeoutError
from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology, blob_name
from suzumio.orchestrator import artifacts as artifacts_module
from suzumio.orchestrator.artifacts import ArtifactCollector, Collection
from suzumio.orchestrator.backends.base import Exit
from suzumio.orchestrator.engine import Orchestrator, Tracked
from suzumio.orchestrator.planning import Planner
from suzumio.orchestrator.sessions import Artifact
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.bus.objects import put_blob
from suzumio.platform.db.pool import Pool
from suzumio.platform.secrets import SecretBox
from suzumio.platform.tokens import TokenSigner
from tests.unit.test_process_isolation_probe import plan_in


class Commands:
    """Records the RecordArtifact commands instead of sending them; the first `timeouts`
    sends time out (the session service restarting) after the command was applied."""

    def __init__(self, timeouts: int = 0) -> None:
        self.sent: list[Any] = []
        self.timeouts = timeouts

    async def send(self, command: Any, actor: str) -> None:
        del actor
        self.sent.append(command)
        if self.timeouts > 0:
            self.timeouts -= 1
            raise CommandTimeoutError("the session service did not answer in time")


@pytest.fixture
async def objects(nc: NATS, topology: Topology) -> ObjectStore:
    return await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))


def collector(
    nc: NATS, topology: Topology, objects: ObjectStore, commands: Commands, max_files: int = 10
) -> ArtifactCollector:
    return ArtifactCollector(
        nc.jetstream(),
        objects,
        topology.bucket(ARTIFACTS_BUCKET),
        cast("Pool", None),  # the tests name the session's artifacts: no projection is read
        cast("CommandClient", commands),
        max_bytes=1 << 20,
        max_files=max_files,
    )


def out_of(tmp_path: Path) -> tuple[Collection, Path]:
    plan = plan_in(tmp_path)
    out = plan.host_dir / "workspace" / "out"
    out.mkdir(parents=True)
    return Collection("p1", "s1", plan.activation_id, "process", plan.host_dir), out


async def stored(objects: ObjectStore, data: bytes, path: str) -> Artifact:
    digest = hashlib.sha256(data).hexdigest()
    await objects.put(blob_name(digest), data)
    return Artifact(id=new_id(), path=path, sha256=digest, size=len(data))


# -- files out --------------------------------------------------------------------------------


async def test_a_name_that_is_not_utf8_costs_only_its_own_file(
    nc: NATS, topology: Topology, objects: ObjectStore, tmp_path: Path
) -> None:
    """`touch $'a/\\xff'` in out/ (a name no artifact can have): skipped, and the files after
    it in path order are recorded all the same."""
    target, out = out_of(tmp_path)
    (out / "a").mkdir()
    Path(os.fsdecode(os.fsencode(out / "a") + b"/\xff")).write_bytes(b"not a name")
    (out / "b.txt").write_bytes(b"b")
    (out / "c.txt").write_bytes(b"c")
    commands = Commands()
    recorded = await collector(nc, topology, objects, commands).collect(target, Exit(0))
    assert recorded == ["b.txt", "c.txt"]
    assert [c.path for c in commands.sent] == recorded


async def test_a_path_longer_than_an_artifact_path_costs_only_its_own_file(
    nc: NATS, topology: Topology, objects: ObjectStore, tmp_path: Path
) -> None:
    """A file five directories of 250 characters deep (a path of more than the 1,000
    characters an artifact's path may have): skipped, the others recorded."""
    target, out = out_of(tmp_path)
    deep = out
    for letter in "abcde":
        deep = deep / (letter * 250)
    deep.mkdir(parents=True)
    (deep / "f.txt").write_bytes(b"deep")
    (out / "z.txt").write_bytes(b"z")
    commands = Commands()
    recorded = await collector(nc, topology, objects, commands).collect(target, Exit(0))
    assert recorded == ["z.txt"]


async def test_a_file_changed_while_it_is_stored_never_stores_other_bytes_under_its_digest(
    nc: NATS,
    topology: Topology,
    objects: ObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bytes stored under a digest are the bytes of that digest, whatever the file does
    between its hashing and its upload (a process left behind still writing to it): the
    store is content-addressed and shared, so other bytes under a digest would be served to
    every later file with that digest."""
    target, out = out_of(tmp_path)
    victim = out / "report.txt"
    victim.write_bytes(b"the bytes that were hashed")
    real_put = put_blob

    async def put_after_a_change(store: ObjectStore, sha256_hex: str, source: Any) -> None:
        victim.write_bytes(b"other bytes, written after the hashing")
        await real_put(store, sha256_hex, source)

    monkeypatch.setattr(artifacts_module, "put_blob", put_after_a_change)
    commands = Commands()
    await collector(nc, topology, objects, commands).collect(target, Exit(0))
    for command in commands.sent:
        data = (await objects.get(blob_name(command.sha256))).data or b""
        assert hashlib.sha256(data).hexdigest() == command.sha256
        assert len(data) == command.size


async def test_the_store_briefly_in_trouble_loses_no_file(
    nc: NATS,
    topology: Topology,
    objects: ObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An upload that times out and a record whose answer is lost (NATS or the session
    service briefly away) are tried again: every file of out/ is recorded, none given up
    (the activation's directory is removed once it ended)."""
    monkeypatch.setattr(artifacts_module, "RETRY_FIRST_SECONDS", 0.01)
    target, out = out_of(tmp_path)
    for name in ("a.txt", "b.txt", "c.txt"):
        (out / name).write_bytes(name.encode())
    real_put = put_blob
    failures = [nats.errors.TimeoutError()]

    async def flaky_put(store: ObjectStore, sha256_hex: str, source: Any) -> None:
        if failures:
            raise failures.pop()
        await real_put(store, sha256_hex, source)

    monkeypatch.setattr(artifacts_module, "put_blob", flaky_put)
    commands = Commands(timeouts=1)
    recorded = await collector(nc, topology, objects, commands).collect(target, Exit(0))
    assert recorded == ["a.txt", "b.txt", "c.txt"]
    assert {c.path for c in commands.sent} == {"a.txt", "b.txt", "c.txt"}
    for command in commands.sent:
        assert (await objects.get(blob_name(command.sha256))).data == command.path.encode()


async def test_the_walk_of_a_huge_out_holds_a_bounded_number_of_entries(
    nc: NATS,
    topology: Topology,
    objects: ObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An out/ of more entries than the walk looks at (millions of links or empty files are
    cheap to make, and a walk that held them all would take the orchestrator down, again at
    each restart): only `MAX_ENTRIES` (here 100) are taken from the listing; the files among
    them are still recorded."""
    monkeypatch.setattr(artifacts_module, "MAX_ENTRIES", 100)
    target, out = out_of(tmp_path)
    (out / "a.txt").write_bytes(b"a")
    for i in range(1_000):
        (out / f"link{i:04}").symlink_to("nowhere")
    pulled = 0
    real_scandir = os.scandir

    class Counting:
        def __init__(self, path: Any) -> None:
            self._listing = real_scandir(path)

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *_: object) -> None:
            self._listing.close()

        def __iter__(self) -> Counting:
            return self

        def __next__(self) -> os.DirEntry[str]:
            nonlocal pulled
            pulled += 1
            return next(self._listing)

    monkeypatch.setattr(os, "scandir", Counting)
    recorded = await collector(nc, topology, objects, Commands()).collect(target, Exit(0))
    assert pulled <= 101
    assert recorded in ([], ["a.txt"])  # the listing's order decides whether it was among them


# -- files in ---------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [252, 300])
async def test_a_name_too_long_for_the_file_system_does_not_fail_every_launch(
    nc: NATS, topology: Topology, objects: ObjectStore, tmp_path: Path, length: int
) -> None:
    """An uploaded file whose name is 252 bytes (a valid name, whose partial file's name
    would not be) or 300 bytes (no file system holds it; 100 CJK characters are): the copy
    goes on — the first is placed, the second skipped — and the session's other files are
    there; the launch is not failed (which every later activation of the session would be
    too)."""
    plan = plan_in(tmp_path)
    long_name = "x" * length
    known = {
        long_name: await stored(objects, b"long", long_name),
        "z.txt": await stored(objects, b"z", "z.txt"),
    }
    await collector(nc, topology, objects, Commands()).copy_in(plan, known)
    inbox = plan.host_dir / "workspace" / "in"
    assert (inbox / "z.txt").read_bytes() == b"z"
    if length <= 255:
        assert (inbox / long_name).read_bytes() == b"long"
    assert not [p for p in inbox.iterdir() if p.name.endswith(".part")]


# -- retention --------------------------------------------------------------------------------


async def test_a_directory_removed_while_the_sweep_runs_does_not_stop_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retention sweep lists the activations' directories, then looks at each: one
    removed in between (its backend's cleanup at the end of its activation, while the sweep
    removed another) is passed over, and the sweep goes on — this pass, and the next ones —
    while the directory of a live activation is left alone, however old."""
    settings = OrchestratorSettings(work_dir=tmp_path / "sandboxes", data_dir=tmp_path)
    key = SecretBox.generate_key()
    orchestrator = Orchestrator(
        cast("NATS", None),
        Topology(namespace="t"),
        cast("EventStore", None),
        "postgresql://unused",
        Planner(cast("EventStore", None), TokenSigner([key]), SecretBox([key]), settings),
        {},
        cast("ArtifactCollector", None),
        retention_hours=1,
    )
    root = settings.sandboxes() / "activations"
    old = time.time() - 7200
    for name in ("a-old", "b-ending", "c-old", "d-live"):
        (root / name / "workspace").mkdir(parents=True)
        os.utime(root / name, (old, old))
    request = ActivationRequested(activation_id=new_id(), agent_id=new_id(), signal_ids=())
    orchestrator.activations["b-ending"] = Tracked("s1", request, ended=True)
    orchestrator.activations["d-live"] = Tracked("s1", request)
    real_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        real_rmtree(path, *args, **kwargs)
        if Path(path).name == "a-old":  # meanwhile, b-ending's cleanup removes its directory
            real_rmtree(root / "b-ending")

    real_scandir = os.scandir

    class InOrder:
        """The root's entries in name order (the engine's own order is the file system's)."""

        def __init__(self, path: Any) -> None:
            self._listing = real_scandir(path)

        def __enter__(self) -> list[os.DirEntry[str]]:
            return sorted(self._listing, key=lambda e: e.name)

        def __exit__(self, *_: object) -> None:
            self._listing.close()

    def scandir(path: Any = ".") -> Any:
        ours = isinstance(path, (str, os.PathLike)) and Path(path) == root
        return InOrder(path) if ours else real_scandir(path)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    monkeypatch.setattr(os, "scandir", scandir)
    done = asyncio.Event()
    real_wait_for = asyncio.wait_for
    passes = 0

    async def no_wait(awaitable: Any, timeout: float | None) -> Any:
        nonlocal passes
        if timeout != 600:
            return await real_wait_for(awaitable, timeout)
        awaitable.close()
        passes += 1
        if passes > 2:
            done.set()
        raise TimeoutError

    monkeypatch.setattr(asyncio, "wait_for", no_wait)
    gc = asyncio.ensure_future(orchestrator._gc_loop(done))  # noqa: SLF001
    await real_wait_for(asyncio.shield(gc), 10)
    assert sorted(p.name for p in root.iterdir()) == ["d-live"]


async def test_the_orchestrators_sweep_purges_a_killed_puts_chunks_once_an_hour(
    nc: NATS, topology: Topology, objects: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's retention sweep also clears the artifacts' store of chunks no record
    names (here as if an hour had passed since they were written), and lists the store no
    more than once an hour."""
    monkeypatch.setattr(artifacts_module, "STRAY_CHUNKS_AGE_SECONDS", 0.0)
    sweeper = collector(nc, topology, objects, Commands())
    bucket = topology.bucket(ARTIFACTS_BUCKET)
    js = nc.jetstream()

    async def stray(nuid: str) -> int:
        await js.publish(f"$O.{bucket}.C.{nuid}", b"a killed put's chunk")
        return (await js.stream_info(f"OBJ_{bucket}")).state.messages

    held = await stray("KILLEDONE")
    assert await sweeper.sweep_strays() == 1
    assert (await js.stream_info(f"OBJ_{bucket}")).state.messages == held - 1
    held = await stray("KILLEDTWO")
    assert await sweeper.sweep_strays() == 0  # within the hour: not looked for
    assert (await js.stream_info(f"OBJ_{bucket}")).state.messages == held
