"""For unit tests of the agent loop: an activation's input, and the tool-broker's side of the
runner contract as an `httpx.MockTransport` handler that records every body the runner sends
and answers as the broker does when all is well — so a test asserts what the runner decided to
send. Tests that need the real broker's behaviour run against the service (tests/e2e)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from suzumio.contracts.runner import (
    ActivationSpec,
    AgentHistoryMessage,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    RunnerToolpackSpec,
    SessionRef,
)
from suzumio.contracts.values import ModelSpec

TOKEN = "sza1.the-activations-own-token"


def spec(
    workspace: Path,
    history: tuple[AgentHistoryMessage, ...] = (),
    toolpacks: tuple[RunnerToolpackSpec, ...] = (),
) -> RunnerActivationInput:
    return RunnerActivationInput(
        project=ProjectRef(id="p" * 26, name="p"),
        agent=AgentSpec(id="a" * 26, role="r", prompt="p", model=ModelSpec(name="primary")),
        session=SessionRef(id="s" * 26),
        activation=ActivationSpec(id="x" * 26),
        workspace=str(workspace),
        controller_url="http://broker",
        token=TOKEN,
        history=history,
        toolpacks=toolpacks,
    )


class Broker:
    def __init__(self) -> None:
        self.bodies: dict[str, list[dict[str, Any]]] = {}

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.bodies.setdefault(request.url.path, []).append(body)
        if request.url.path == "/runner/signals":
            return httpx.Response(200, json={"signals": []})
        return httpx.Response(200, json={"recorded": True})

    def tool_results(self) -> list[dict[str, Any]]:
        entries = (e for b in self.bodies.get("/runner/history", []) for e in b["entries"])
        return [e for e in entries if e["role"] == "tool"]
