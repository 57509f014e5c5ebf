"""The orchestrator's own file exchange for the backends on this host (process, docker) against
a sandbox that plants links in its workspace (real NATS object store): collecting `out/` never
reads through a link — `out` itself, `workspace`, or anything under `out` — and copying the
session's artifacts into `in/` never writes through one. The orchestrator may run as root, so
a followed link would hand it the host's files (other activations' tokens, the secret key)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, cast

import pytest
from nats.aio.client import Client as NATS
from nats.js.object_store import ObjectStore

from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology, blob_name
from suzumio.orchestrator.artifacts import ArtifactCollector, Collection
from suzumio.orchestrator.backends.base import Exit, LaunchPlan
from suzumio.orchestrator.sessions import Artifact
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.bus.objects import has_blob
from suzumio.platform.db.pool import Pool
from tests.unit.test_process_isolation_probe import plan_in

SECRET = b"SUZUMIO_SECRET_KEY=not-for-any-sandbox\n"


class Commands:
    """Records the RecordArtifact commands instead of sending them."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, command: Any, actor: str) -> None:
        del actor
        self.sent.append(command)


class World:
    """An activation's directory under the sandboxes' root, beside another activation's
    (its input holds a live token) and the host's secret."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.launch = plan_in(root)  # its directory: root/sandboxes/activations/<id>
        self.activation_id = self.launch.activation_id
        self.host_dir = self.launch.host_dir
        self.workspace = self.host_dir / "workspace"
        (self.workspace / "out").mkdir(parents=True)
        other = root / "sandboxes" / "activations" / "other"
        other.mkdir(parents=True)
        (other / "input.json").write_bytes(b'{"token": "live-token-of-another"}')
        self.secrets = root / "secrets"
        self.secrets.mkdir()
        (self.secrets / "secret_key").write_bytes(SECRET)
        self.outside = root / "outside"
        self.outside.mkdir()

    def collection(self) -> Collection:
        return Collection("p1", "s1", self.activation_id, "process", self.host_dir)

    def plan(self) -> LaunchPlan:
        return self.launch


@pytest.fixture
async def store(nc: NATS, topology: Topology) -> ObjectStore:
    return await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))


def collector(
    nc: NATS, topology: Topology, store: ObjectStore, commands: Commands
) -> ArtifactCollector:
    return ArtifactCollector(
        nc.jetstream(),
        store,
        topology.bucket(ARTIFACTS_BUCKET),
        cast("Pool", None),  # the tests name the session's artifacts: no projection is read
        cast("CommandClient", commands),
        max_bytes=1 << 20,
        max_files=10,
    )


async def stored(store: ObjectStore, data: bytes, path: str) -> Artifact:
    digest = hashlib.sha256(data).hexdigest()
    await store.put(blob_name(digest), data)
    return Artifact(id=new_id(), path=path, sha256=digest, size=len(data))


async def leaked(store: ObjectStore) -> list[str]:
    """Which of the host's files' bytes reached the artifacts' store."""
    host = {"secret": SECRET, "token": b'{"token": "live-token-of-another"}'}
    return [n for n, b in host.items() if await has_blob(store, hashlib.sha256(b).hexdigest())]


@pytest.mark.parametrize("link", ["out->../..", "out->secrets", "workspace->elsewhere"])
async def test_a_linked_out_or_workspace_is_not_collected(
    nc: NATS, topology: Topology, store: ObjectStore, tmp_path: Path, link: str
) -> None:
    """`rm -rf out && ln -s ../.. out` (or a link to any host directory), or the workspace
    itself swapped for a link to a directory with an `out`: nothing is recorded, no byte of
    the host's files is stored."""
    world = World(tmp_path)
    out = world.workspace / "out"
    out.rmdir()
    if link == "out->../..":
        out.symlink_to("../..")  # the activation's directory and all the others
    elif link == "out->secrets":
        out.symlink_to(world.secrets)
    else:
        world.workspace.rmdir()
        (world.outside / "out").symlink_to(world.secrets)
        world.workspace.symlink_to(world.outside)
    commands = Commands()
    recorded = await collector(nc, topology, store, commands).collect(world.collection(), Exit(0))
    assert recorded == []
    assert commands.sent == []
    assert await leaked(store) == []


async def test_links_and_special_files_under_out_are_skipped(
    nc: NATS, topology: Topology, store: ObjectStore, tmp_path: Path
) -> None:
    """Only regular files are recorded: a linked subdirectory, a link to a file and a FIFO
    under `out` are skipped (the FIFO without hanging), the rest is recorded as usual."""
    world = World(tmp_path)
    out = world.workspace / "out"
    (out / "report.md").write_bytes(b"# report\n")
    (out / "deep").mkdir()
    (out / "deep" / "data.csv").write_bytes(b"a,b\n")
    (out / "linked").symlink_to(world.secrets)
    (out / "deep" / "key").symlink_to(world.secrets / "secret_key")
    (out / "token.json").symlink_to(tmp_path / "sandboxes" / "activations" / "other" / "input.json")
    os.mkfifo(out / "pipe")
    commands = Commands()
    recorded = await collector(nc, topology, store, commands).collect(world.collection(), Exit(0))
    assert recorded == ["deep/data.csv", "report.md"]
    assert [c.path for c in commands.sent] == recorded
    assert await leaked(store) == []


async def test_copy_in_replaces_planted_links_and_never_writes_through_them(
    nc: NATS, topology: Topology, store: ObjectStore, tmp_path: Path
) -> None:
    """A warm workspace (a sandbox of this activation ran in it before) whose `in/` entries
    are links out of it: the session's file replaces a linked file (the link, not its target)
    and is not written into a linked directory — nothing outside the workspace changes."""
    world = World(tmp_path)
    victim = world.outside / "victim.txt"
    victim.write_bytes(b"the host's own")
    inbox = world.workspace / "in"
    inbox.mkdir()
    (inbox / "a.txt").symlink_to(victim)
    (inbox / "docs").symlink_to(world.outside)
    known = {
        "a.txt": await stored(store, b"artifact a", "a.txt"),
        "docs/x.txt": await stored(store, b"artifact x", "docs/x.txt"),
        "b.txt": await stored(store, b"artifact b", "b.txt"),
    }
    await collector(nc, topology, store, Commands()).copy_in(world.plan(), known)
    assert victim.read_bytes() == b"the host's own"
    assert sorted(p.name for p in world.outside.iterdir()) == ["victim.txt"]
    assert not (inbox / "a.txt").is_symlink()
    assert (inbox / "a.txt").read_bytes() == b"artifact a"
    assert (inbox / "b.txt").read_bytes() == b"artifact b"


@pytest.mark.parametrize("link", ["in", "workspace"])
async def test_copy_in_refuses_a_linked_in_or_workspace(
    nc: NATS, topology: Topology, store: ObjectStore, tmp_path: Path, link: str
) -> None:
    """`in` (or the workspace, holding an `in`) swapped for a link to a host directory: the
    copy is refused and nothing is written there."""
    world = World(tmp_path)
    if link == "in":
        (world.workspace / "in").symlink_to(world.outside)
    else:
        (world.outside / "in").mkdir()
        (world.outside / "out").mkdir()
        (world.workspace / "out").rmdir()
        world.workspace.rmdir()
        world.workspace.symlink_to(world.outside)
    before = sorted(p.relative_to(world.outside) for p in world.outside.rglob("*"))
    known = {"x.txt": await stored(store, b"artifact x", "x.txt")}
    refused = None
    try:
        await collector(nc, topology, store, Commands()).copy_in(world.plan(), known)
    except OSError as exc:
        refused = exc
    assert sorted(p.relative_to(world.outside) for p in world.outside.rglob("*")) == before
    assert refused is not None
