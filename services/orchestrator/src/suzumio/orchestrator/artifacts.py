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
"""

from __future__ import annotations

import contextlib
import hashlib
import mimetypes
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from nats.js.client import JetStreamContext
from nats.js.object_store import ObjectStore

from suzumio.contracts.commands import RecordArtifact
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.ids import derived_id
from suzumio.contracts.runner import FileExchange, FileRef, InputFile
from suzumio.orchestrator.backends.base import Exit, LaunchPlan
from suzumio.orchestrator.sessions import Artifact, session_artifacts
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.objects import has_blob, put_blob, read_chunks
from suzumio.platform.db.pool import Pool
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
LOCAL_BACKENDS = frozenset({"process", "docker"})
REMOTE_BACKENDS = frozenset({"pool"})  # the worker exchanges through the object store
BROKER_BACKENDS = frozenset({"kubernetes"})  # the runner exchanges through the broker
ACTOR = "system:orchestrator"


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
        workspace = plan.host_dir / "workspace"
        (workspace / "out").mkdir(parents=True, exist_ok=True)
        plan.session_dir.mkdir(parents=True, exist_ok=True)
        if plan.mounts:
            return plan  # `mount` workspace mode: the grants are the inputs
        for path, artifact in (await self._files(plan, known)).items():
            target = _inside(workspace / "in", path)
            if target is None or (target.exists() and target.stat().st_size == artifact.size):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as sink:
                async for chunk in read_chunks(
                    self._js, self._store, self._bucket, artifact.sha256
                ):
                    sink.write(chunk)
        return plan

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
        """Record what the activation left in `workspace/out` (regular files only, no
        symlinks) as artifacts of the session; the paths recorded."""
        if target.backend in REMOTE_BACKENDS:
            return await self._record_remote(target, exit_.outputs)
        if target.backend not in LOCAL_BACKENDS:
            return []
        out = target.host_dir / "workspace" / "out"
        if not out.is_dir():
            return []
        recorded: list[str] = []
        for path in sorted(out.rglob("*")):
            if len(recorded) >= self._max_files:
                log.warning("artifacts.too_many", activation=target.activation_id)
                break
            if path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            if size > self._max_bytes:
                log.warning("artifacts.too_large", activation=target.activation_id, size=size)
                continue
            relative = path.relative_to(out).as_posix()
            try:
                ref = FileRef(path=relative, sha256=_sha256(path), size=size)
            except ValueError:  # a name no workspace could hold again (a backslash, …)
                log.warning("artifacts.unplaceable", activation=target.activation_id)
                continue
            with path.open("rb") as source:
                await put_blob(self._store, ref.sha256, source)
            await self._record(target, ref)
            recorded.append(relative)
        return recorded

    async def _record_remote(self, target: Collection, outputs: tuple[FileRef, ...]) -> list[str]:
        """The files a worker says it stored, within this collector's limits, and only if
        their bytes are really in the object store."""
        recorded: list[str] = []
        for ref in outputs[: self._max_files]:
            if ref.size > self._max_bytes or not await has_blob(self._store, ref.sha256):
                log.warning("artifacts.refused", activation=target.activation_id, path=ref.path)
                continue
            await self._record(target, ref)
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


def _inside(root: Path, relative: str) -> Path | None:
    target = (root / relative).resolve()
    return target if target.is_relative_to(root.resolve()) else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
