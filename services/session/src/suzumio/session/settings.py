from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from suzumio.platform.settings import ServiceSettings


class SessionSettings(ServiceSettings):
    http_port: int = Field(default=8091, ge=0, le=65_535)
    projector_batch: int = Field(default=1_000, ge=1, le=10_000)
    run_projector: bool = Field(default=True, description="host the projector (one leads)")
    mount_roots: str = Field(
        default="",
        description="host directories under which mount grants may point, separated by "
        f"'{os.pathsep}'; empty: no mount grants",
    )

    work_dir: Path | None = Field(
        default=None,
        description="the orchestrator's (SUZUMIO_WORK_DIR): no grant may reach into it",
    )

    def allowed_mount_roots(self) -> tuple[Path, ...]:
        return tuple(Path(p) for p in self.mount_roots.split(os.pathsep) if p.strip())

    def reserved_dirs(self) -> tuple[Path, ...]:
        """The platform's own directories, which no mount grant may overlap: the data
        directory and the sandboxes' (every activation's input, with its token)."""
        sandboxes = self.work_dir or self.data_dir / "sandboxes"
        return (self.data_dir, sandboxes)
