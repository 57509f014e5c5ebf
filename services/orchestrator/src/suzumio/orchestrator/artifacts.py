"""Files in and out of a sandbox: the session's artifacts copied into `/workspace/in` before a
launch (agents in `copy` workspace mode), and what the activation left in `/workspace/out`
stored as artifacts of the session afterwards, so the next activation can use them.

Backends that use this host's disk (process, docker) exchange the files here, through the
activation's directory. The pool's sandboxes run on the workers' hosts: the plan names the
session's artifacts (`LaunchPlan.inputs`), the worker copies them in from the object store,
stores what the activation left in `out/` there and names those files in its last word
(`Exit.outputs`), which are recorded here like local ones. A Kubernetes Job's runner shares
neither with the platform: its input names the artifacts (`files`, with their ids), it fetches
them from the tool-broker and sends `out/`'s files back there, and the broker records them.

A local workspace is the sandbox's to change, links included, and this process may run as
root: its files are reached one name at a time from an opened directory, never through a link
(`workspace`, `in`, `out` and everything under them), so a planted link neither brings a host
file in as an artifact nor has a copied-in file written outside the workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import io
import itertools
import mimetypes
import os
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO

from nats.js.client import JetStreamContext
from nats.js.object_store import ObjectStore

from suzumio.contracts.commands import RecordArtifact
from suzumio.contracts.errors import CommandTimeoutError, ConflictError, UnavailableError
from suzumio.contracts.ids import derived_id
from suzumio.contracts.runner import FileExchange, FileRef, InputFile, placeable
from suzumio.orchestrator.backends.base import Exit, LaunchPlan
from suzumio.orchestrator.sessions import Artifact, session_artifacts, session_closed_at
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.objects import has_blob, put_blob, read_chunks, sweep_stray_chunks
from suzumio.platform.bus.trouble import NATS_TROUBLE
from suzumio.platform.db.pool import Pool
from suzumio.platform.logging import get_logger
from suzumio.platform.offloop import OffLoopWriter

log = get_logger(__name__)
LOCAL_BACKENDS = frozenset({"process", "docker"})
REMOTE_BACKENDS = frozenset({"pool"})  # the worker exchanges through the object store
BROKER_BACKENDS = frozenset({"kubernetes"})  # the runner exchanges through the broker
ACTOR = "system:orchestrator"
MAX_PATH = 1_000  # the longest path an artifact may have (`FileRef`, `RecordArtifact`)
SPOOL_BYTES = 1 << 20  # a file collected is copied aside: in memory up to this, then on disk
# Storing a collected file while the store is in trouble (NATS slow or reconnecting, the
# session service restarting) is tried again after these waits, doubling, for as long as
# the activation is watched: its directory goes once it ended, and its files with it.
RETRY_FIRST_SECONDS = 0.2
RETRY_MAX_SECONDS = 10.0
# Chunks no record names are a killed put's only once nothing could still be writing them;
# looking for them lists every object of the store, so it is done once an hour at most.
STRAY_CHUNKS_AGE_SECONDS = 3_600.0
STRAY_CHUNKS_SWEEP_SECONDS = 3_600.0
_TROUBLE: tuple[type[Exception], ...] = (
    OSError,
    CommandTimeoutError,
    UnavailableError,
    *NATS_TROUBLE,
)


@dataclass(frozen=True)
class Collection:
    """Whose files to collect and where: from the plan, or — for an activation found again
    after an orchestrator restart, whose plan is gone — from what the log and the settings
    say, so its files are not lost with the orchestrator that launched it."""

    project_id: str
    session_id: str
    activation_id: str
    backend: str
    host_dir: Path

    @classmethod
    def of(cls, plan: LaunchPlan) -> Collection:
        return cls(
            plan.project_id,
            plan.session_id,
            plan.activation_id,
            plan.profile.backend.value,
            plan.host_dir,
        )


class ArtifactCollector:
    def __init__(
        self,
        js: JetStreamContext,
        store: ObjectStore,
        bucket: str,
        pool: Pool,
        commands: CommandClient,
        *,
        max_bytes: int,
        max_files: int,
    ) -> None:
        self._js, self._store, self._bucket = js, store, bucket
        self._pool = pool
        self._commands = commands
        self._max_bytes = max_bytes
        self._max_files = max_files
        self._strays_swept_at: float | None = None

    async def closed_at(self, session_id: str, seq: int) -> float | None:
        """When the session was closed, if the read model has it closed as of the log's `seq`
        at least (the retention sweep asks, for sessions whose files it would let go)."""
        return await session_closed_at(self._pool, session_id, seq)

    async def sweep_strays(self) -> int:
        """Purge the chunks of the store's puts killed half-way (any service's: the gateway's
        uploads, the broker's outputs and assets, the pool workers' files), an hour after
        their last chunk, at most once an hour; how many objects' chunks went."""
        now = time.monotonic()
        if self._strays_swept_at is not None and now - self._strays_swept_at < (
            STRAY_CHUNKS_SWEEP_SECONDS
        ):
            return 0
        self._strays_swept_at = now
        swept = await sweep_stray_chunks(self._store, STRAY_CHUNKS_AGE_SECONDS)
        if swept:
            log.info("orchestrator.stray_chunks_swept", objects=swept)
        return swept

    async def copy_in(
        self, plan: LaunchPlan, known: Mapping[str, Artifact] | None = None
    ) -> LaunchPlan:
        """Put the session's artifacts (`known`, by path, as the log folds them; else read
        from the projection) where the sandbox finds them in `/workspace/in` (or, for a remote
        backend, name them in the plan); the plan to launch."""
        backend = plan.profile.backend.value
        if backend in REMOTE_BACKENDS:
            return replace(
                plan,
                inputs=() if plan.mounts else await self._inputs(plan, known),
                max_output_files=self._max_files,
                max_output_bytes=self._max_bytes,
            )
        if backend in BROKER_BACKENDS:
            files = FileExchange(
                inputs=() if plan.mounts else await self._inputs(plan, known),
                max_output_files=self._max_files,
                max_output_bytes=self._max_bytes,
            )
            return replace(plan, input=plan.input.model_copy(update={"files": files}))
        if backend not in LOCAL_BACKENDS:
            return plan
        # The workspace is the sandbox's: any part of it may be a link it planted (a sandbox
        # of this activation launched before, in the same directory), so nothing here is
        # reached through one.
        plan.host_dir.mkdir(parents=True, exist_ok=True)
        os.close(_open_workspace(plan.host_dir, "out", create=True))
        plan.session_dir.mkdir(parents=True, exist_ok=True)
        if plan.mounts:
            return plan  # `mount` workspace mode: the grants are the inputs
        artifacts = await self._files(plan, known)
        if not artifacts:
            return plan
        inbox = _open_workspace(plan.host_dir, "in", create=True)
        try:
            for path, artifact in artifacts.items():
                await self._place(inbox, path, artifact, plan.activation_id)
        finally:
            os.close(inbox)
        return plan

    async def _place(self, inbox: int, path: str, artifact: Artifact, activation: str) -> None:
        """`artifact` at `path` under the directory `inbox`, written to a partial file that
        is renamed over whatever is there (a link is replaced, not followed); nothing if a
        regular file of its size is there already."""
        try:
            at, name = _slot(inbox, path)
        except OSError as exc:  # not a name a workspace holds, or a link on the way
            log.warning("artifacts.unplaceable", activation=activation, path=path, error=str(exc))
            return
        # Of a fixed length: a name the file system holds may be too long with a suffix.
        partial = (
            f".{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}.part"
        )
        try:
            sink = _open_partial(at, name, partial, artifact.size)
            if sink is None:
                return
            try:
                with sink:
                    writer = OffLoopWriter(sink)
                    async for chunk in read_chunks(
                        self._js, self._store, self._bucket, artifact.sha256
                    ):
                        await writer.write(chunk)
                    await writer.close()
                os.replace(partial, name, src_dir_fd=at, dst_dir_fd=at)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(partial, dir_fd=at)
                raise
        except OSError as exc:
            # A directory in the file's place, or a name longer than the file system holds
            # (100 CJK characters are): that file is not placed. Failing the launch instead
            # would fail every later activation of the session the same way.
            unplaceable = isinstance(exc, (IsADirectoryError, FileExistsError))
            if not unplaceable and exc.errno != errno.ENAMETOOLONG:
                raise
            log.warning("artifacts.unplaceable", activation=activation, path=path, error=str(exc))
        finally:
            os.close(at)

    async def _files(
        self, plan: LaunchPlan, known: Mapping[str, Artifact] | None
    ) -> Mapping[str, Artifact]:
        if known is not None:
            return known
        return await session_artifacts(self._pool, plan.session_id)

    async def _inputs(
        self, plan: LaunchPlan, known: Mapping[str, Artifact] | None
    ) -> tuple[InputFile, ...]:
        refs = []
        for path, artifact in (await self._files(plan, known)).items():
            try:
                refs.append(
                    InputFile(
                        path=path,
                        sha256=artifact.sha256,
                        size=artifact.size,
                        artifact_id=artifact.id,
                    )
                )
            except ValueError:  # a path no workspace can hold (recorded by an older version)
                log.warning("artifacts.unplaceable", session=plan.session_id, path=path)
        return tuple(refs)

    async def collect(self, target: Collection, exit_: Exit) -> list[str]:
        """Record what the activation left in `workspace/out` (regular files only: no link
        is followed, on the way to `out` or under it) as artifacts of the session; the paths
        recorded."""
        if target.backend in REMOTE_BACKENDS:
            return await self._record_remote(target, exit_.outputs)
        if target.backend not in LOCAL_BACKENDS:
            return []
        try:
            out = await asyncio.to_thread(_open_workspace, target.host_dir, "out")
        except FileNotFoundError:
            return []
        except OSError as exc:  # `workspace` or `out` made a link (or a file) by the sandbox
            log.warning("artifacts.out_refused", activation=target.activation_id, error=str(exc))
            return []
        try:
            return await self._collect_local(target, out)
        finally:
            os.close(out)

    async def _collect_local(self, target: Collection, out: int) -> list[str]:
        walk = _Walk(target.activation_id, self._max_files, self._max_bytes)
        found = await asyncio.to_thread(walk.run, out)
        if len(found) > self._max_files:
            log.warning("artifacts.too_many", activation=target.activation_id)
        recorded: list[str] = []
        for parts in found[: self._max_files]:
            copied = await asyncio.to_thread(_copy_aside, out, parts, self._max_bytes)
            if copied is None:  # changed since the walk: no longer a small regular file
                log.warning("artifacts.changed", activation=target.activation_id)
                continue
            source, ref = copied
            with source:
                if await self._stored(target, partial(self._store_copy, target, ref, source)):
                    recorded.append(ref.path)
        return recorded

    async def _store_copy(self, target: Collection, ref: FileRef, source: IO[bytes]) -> None:
        source.seek(0)
        await put_blob(self._store, ref.sha256, source)  # type: ignore[arg-type]
        await self._record(target, ref)

    async def _record_held(self, target: Collection, ref: FileRef) -> None:
        if not await has_blob(self._store, ref.sha256):
            raise LookupError("its bytes are not in the object store")
        await self._record(target, ref)

    @staticmethod
    async def _stored(target: Collection, store: Callable[[], Awaitable[None]]) -> bool:
        """Whether `store` stored a file (asked again while the store is in trouble: the
        files are lost if given up); a file refused is that file's loss alone, not the rest's
        (storing and recording again is harmless: the blob is named by its digest, the
        artifact's id is derived from the activation and the path)."""
        delay = RETRY_FIRST_SECONDS
        while True:
            try:
                await store()
            except _TROUBLE as exc:
                log.warning("artifacts.store_failed", activation=target.activation_id,
                            error=repr(exc)[:500], retry_in=delay)  # fmt: skip
            except Exception as exc:
                log.warning("artifacts.refused", activation=target.activation_id,
                            error=repr(exc)[:500])  # fmt: skip
                return False
            else:
                return True
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_SECONDS)

    async def _record_remote(self, target: Collection, outputs: tuple[FileRef, ...]) -> list[str]:
        """The files a worker says it stored, within this collector's limits, and only if
        their bytes are really in the object store."""
        recorded: list[str] = []
        for ref in outputs[: self._max_files]:
            if ref.size > self._max_bytes:
                log.warning("artifacts.refused", activation=target.activation_id, path=ref.path)
            elif await self._stored(target, partial(self._record_held, target, ref)):
                recorded.append(ref.path)
        return recorded

    async def _record(self, target: Collection, ref: FileRef) -> None:
        content_type = mimetypes.guess_type(ref.path)[0] or "application/octet-stream"
        with contextlib.suppress(ConflictError):  # recorded before (collected again)
            await self._commands.send(
                RecordArtifact(
                    project_id=target.project_id,
                    artifact_id=derived_id("artifact", target.activation_id, ref.path),
                    session_id=target.session_id,
                    path=ref.path,
                    sha256=ref.sha256,
                    size=ref.size,
                    content_type=content_type,
                    source="activation",
                    activation_id=target.activation_id,
                ),
                actor=ACTOR,
            )


# Opened one name at a time relative to the directory above, never through a link: this
# process may run as root, and a link planted in the workspace must not make it read or write
# the host's files. O_NONBLOCK: opening a FIFO put in a file's place does not hang.
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 32  # below it, `out` is not walked: open directories stay few
# Entries of `out` looked at, at most, however many it holds (millions of empty files or
# links are cheap to make): what the walk holds in memory stays bounded.
MAX_ENTRIES = 100_000


def _open_dir(name: str, at: int, *, create: bool = False) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=at)
    return os.open(name, _DIR, dir_fd=at)


def _descend(top: int, names: Sequence[str], *, create: bool = False) -> int:
    """The directory `names` lead to from the directory `top`, opened (a descriptor of its
    own; `top` stays open).

    Raises:
        OSError: missing (unless `create`), a link or not a directory on the way.
    """
    at = os.dup(top)
    for name in names:
        try:
            below = _open_dir(name, at, create=create)
        finally:
            os.close(at)
        at = below
    return at


def _open_workspace(host_dir: Path, name: str, *, create: bool = False) -> int:
    """`host_dir/workspace/<name>`, opened; the activation's directory itself is the
    orchestrator's own, what is below it the sandbox's."""
    host = os.open(host_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _descend(host, ("workspace", name), create=create)
    finally:
        os.close(host)


def _slot(inbox: int, path: str) -> tuple[int, str]:
    """The directory (made as needed) holding `path`'s file under `inbox`, opened, and the
    file's name in it.

    Raises:
        OSError: not a relative path of names, or a link or a file on the way.
    """
    if not placeable(path):
        raise OSError(f"not a relative path of names: {path!r}")
    *dirs, name = path.split("/")
    return _descend(inbox, dirs, create=True), name


def _open_partial(at: int, name: str, partial: str, size: int) -> io.BufferedWriter | None:
    """A fresh partial file beside `name` in the directory `at`, or None if `name` is a
    regular file of `size` bytes already (a warm workspace's)."""
    with contextlib.suppress(FileNotFoundError):
        info = os.stat(name, dir_fd=at, follow_symlinks=False)
        if stat.S_ISREG(info.st_mode) and info.st_size == size:
            return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(partial, dir_fd=at)  # a link or a file left there: gone, not followed
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(partial, flags, 0o644, dir_fd=at), "wb")


class _Walk:
    """The regular files under an opened `out`, as path parts in path order, each within
    the size limit and with a name a workspace can hold — one more than `max_files` at most,
    to tell there were too many. What is not a directory or a regular file (links, devices,
    FIFOs, sockets) is skipped, never followed, and logged once. At most `MAX_ENTRIES`
    entries are looked at; a directory cut short is walked in the file system's order."""

    def __init__(self, activation: str, max_files: int, max_bytes: int) -> None:
        self._activation = activation
        self._max_files, self._max_bytes = max_files, max_bytes
        self._left = MAX_ENTRIES
        self.found: list[tuple[str, ...]] = []
        self.skipped = 0
        self.examples: list[str] = []

    def run(self, out: int) -> list[tuple[str, ...]]:
        self._dir(out, ())
        if self.skipped:
            log.warning(
                "artifacts.skipped",
                activation=self._activation,
                count=self.skipped,
                examples=self.examples,
            )
        if self._left < 0:
            log.warning("artifacts.too_many_entries", activation=self._activation)
        return self.found

    def _skip(self, parts: tuple[str, ...]) -> None:
        self.skipped += 1
        if len(self.examples) < 5:
            self.examples.append("/".join(parts))

    def _dir(self, fd: int, prefix: tuple[str, ...]) -> bool:
        """Whether to go on (the limits are not reached)."""
        with os.scandir(fd) as listing:
            entries = list(itertools.islice(listing, max(self._left, 0) + 1))
        cut = len(entries) > self._left
        entries = sorted(entries[: max(self._left, 0)], key=lambda e: e.name)
        self._left = -1 if cut else self._left - len(entries)  # -1: cut short
        for entry in entries:
            parts = (*prefix, entry.name)
            if entry.is_dir(follow_symlinks=False) and len(parts) < MAX_DEPTH:
                if not self._subdir(fd, parts):
                    return False
            elif entry.is_file(follow_symlinks=False):
                try:
                    size = entry.stat(follow_symlinks=False).st_size
                except OSError:  # gone since it was listed
                    self._skip(parts)
                    continue
                self._file(parts, size)
                if len(self.found) > self._max_files:
                    return False
            else:
                self._skip(parts)
        return self._left >= 0

    def _subdir(self, fd: int, parts: tuple[str, ...]) -> bool:
        try:
            sub = _open_dir(parts[-1], fd)
        except OSError:  # swapped for a link (or gone) since it was listed
            self._skip(parts)
            return True
        try:
            return self._dir(sub, parts)
        finally:
            os.close(sub)

    def _file(self, parts: tuple[str, ...], size: int) -> None:
        if size > self._max_bytes:
            log.warning("artifacts.too_large", activation=self._activation, size=size)
        elif not _collectable("/".join(parts)):
            log.warning("artifacts.unplaceable", activation=self._activation)
        else:
            self.found.append(parts)


def _collectable(path: str) -> bool:
    """Whether a file of `out` at `path` can be an artifact: a name a workspace could hold
    again (no `\\`), of at most `MAX_PATH` characters, in UTF-8 (a name of other bytes is
    not text an artifact's path can be: it would fail the record)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return len(path) <= MAX_PATH and placeable(path)


def _copy_aside(
    out: int, parts: tuple[str, ...], max_bytes: int
) -> tuple[IO[bytes], FileRef] | None:
    """A copy of the file at `parts` under `out`, and its reference — if it is a regular
    file, reached without a link, and holds at most `max_bytes` as it is read. The copy is
    what is stored, so the bytes stored under a digest are those that were hashed, whatever
    the file does meanwhile (the store is content-addressed: other bytes under a digest would
    be served for every file with that digest)."""
    try:
        at = _descend(out, parts[:-1])
    except OSError:
        return None
    try:
        fd = os.open(parts[-1], _FILE, dir_fd=at)
    except OSError:
        return None
    finally:
        os.close(at)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        copy: IO[bytes] = tempfile.SpooledTemporaryFile(SPOOL_BYTES)  # noqa: SIM115
        try:
            digest, size = hashlib.sha256(), 0
            while block := source.read(min(1 << 20, max_bytes + 1 - size)):
                digest.update(block)
                copy.write(block)
                size += len(block)
                if size > max_bytes:  # grew past the limit while it was read
                    copy.close()
                    return None
        except OSError:
            copy.close()
            return None
    return copy, FileRef(path="/".join(parts), sha256=digest.hexdigest(), size=size)
