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

    def allowed_mount_roots(self) -> tuple[Path, ...]:
        return tuple(Path(p) for p in self.mount_roots.split(os.pathsep) if p.strip())
