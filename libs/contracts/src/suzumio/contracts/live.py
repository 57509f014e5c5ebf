"""Live output: what flows on `live.session.<id>` (memory stream LIVE), never in the event log."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.ids import Identifier


class LiveChunk(BaseModel):
    """One batch of live output of an activation: token text, tool progress or a state blip."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    session_id: Identifier
    activation_id: Identifier
    kind: Literal["text", "tool_progress", "state"]
    text: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime
