"""Files in and out of a sandbox: the session's artifacts copied into `/workspace/in` before a
launch (agents in `copy` workspace mode), and what the activation left in `/workspace/out`
stored as artifacts of the session afterwards, so the next activation can use them.

Only backends that use this host's disk (process, docker) exchange files this way; the
kubernetes and pool backends run elsewhere (their sandboxes would upload through the broker).
"""

from __future__ import annotations

import contextlib
import hashlib
import mimetypes
from pathlib import Path

from nats.js.client import JetStreamContext
from nats.js.object_store import ObjectStore

from suzumio.contracts.commands import RecordArtifact
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.ids import derived_id
from suzumio.orchestrator.backends.base import LaunchPlan
from suzumio.orchestrator.sources import session_artifacts
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.objects import put_blob, read_chunks
from suzumio.platform.db.pool import Pool
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
LOCAL_BACKENDS = frozenset({"process", "docker"})
ACTOR = "system:orchestrator"


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

    async def copy_in(self, plan: LaunchPlan) -> None:
        if plan.profile.backend.value not in LOCAL_BACKENDS:
            return
        workspace = plan.host_dir / "workspace"
        (workspace / "out").mkdir(parents=True, exist_ok=True)
        plan.session_dir.mkdir(parents=True, exist_ok=True)
        if plan.mounts:
            return  # `mount` workspace mode: the grants are the inputs
        for path, artifact in (await session_artifacts(self._pool, plan.session_id)).items():
            target = _inside(workspace / "in", path)
            if target is None or (target.exists() and target.stat().st_size == artifact.size):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as sink:
                async for chunk in read_chunks(
                    self._js, self._store, self._bucket, artifact.sha256
                ):
                    sink.write(chunk)

    async def collect(self, plan: LaunchPlan) -> list[str]:
        """Store the files of `workspace/out` (regular files only, no symlinks) as artifacts."""
        if plan.profile.backend.value not in LOCAL_BACKENDS:
            return []
        out = plan.host_dir / "workspace" / "out"
        if not out.is_dir():
            return []
        recorded: list[str] = []
        for path in sorted(out.rglob("*")):
            if len(recorded) >= self._max_files:
                log.warning("artifacts.too_many", activation=plan.activation_id)
                break
            if path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            if size > self._max_bytes:
                log.warning("artifacts.too_large", activation=plan.activation_id, size=size)
                continue
            relative = path.relative_to(out).as_posix()
            digest = _sha256(path)
            with path.open("rb") as source:
                await put_blob(self._store, digest, source)
            content_type = mimetypes.guess_type(relative)[0] or "application/octet-stream"
            with contextlib.suppress(ConflictError):  # recorded before (collected again)
                await self._commands.send(
                    RecordArtifact(
                        project_id=plan.project_id,
                        artifact_id=derived_id("artifact", plan.activation_id, relative),
                        session_id=plan.session_id,
                        path=relative,
                        sha256=digest,
                        size=size,
                        content_type=content_type,
                        source="activation",
                        activation_id=plan.activation_id,
                    ),
                    actor=ACTOR,
                )
            recorded.append(relative)
        return recorded


def _inside(root: Path, relative: str) -> Path | None:
    target = (root / relative).resolve()
    return target if target.is_relative_to(root.resolve()) else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
