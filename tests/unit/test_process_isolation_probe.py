"""Where bubblewrap is installed but cannot make its namespaces (an unprivileged container),
the process backend says so in its health and refuses launches with what to do, instead of
starting runners that die at once. The failing `bwrap` here is a stand-in script on PATH —
the real one works on this machine, which is the point of the stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    SessionRef,
)
from suzumio.contracts.values import Backend, ModelSpec, RuntimeProfileSpec
from suzumio.orchestrator.backends.base import LaunchError, LaunchPlan
from suzumio.orchestrator.backends.process import ProcessBackend, ProcessSettings

REFUSAL = "bwrap: No permissions to create new namespace"


def plan_in(tmp_path: Path) -> LaunchPlan:
    activation_id = new_id()
    spec = RunnerActivationInput(
        project=ProjectRef(id="p1", name="project"),
        agent=AgentSpec(id="a1", role="tester", prompt="be brief", model=ModelSpec(name="m")),
        session=SessionRef(id="s1"),
        activation=ActivationSpec(id=activation_id),
        controller_url="http://127.0.0.1:9",
        token="not-a-real-token",
    )
    return LaunchPlan(
        activation_id=activation_id,
        session_id="s1",
        project_id="p1",
        agent_id="a1",
        attempt=1,
        input=spec,
        profile=RuntimeProfileSpec(backend=Backend.PROCESS),
        env={},
        secret_keys=frozenset(),
        host_dir=tmp_path / "sandboxes" / "activations" / activation_id,
        session_dir=tmp_path / "sandboxes" / "sessions" / "s1",
    )


@pytest.fixture
def refusing_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "bwrap"
    script.write_text(f"#!/bin/sh\necho '{REFUSAL}' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return script


async def test_an_unusable_bubblewrap_is_reported_and_launches_refused(
    refusing_bwrap: Path, tmp_path: Path
) -> None:
    backend = ProcessBackend(tmp_path / "sandboxes")
    health = await backend.health()
    assert health.ok is False
    assert REFUSAL in str(health.detail["isolation_problem"])
    plan = plan_in(tmp_path)
    with pytest.raises(LaunchError, match="SUZUMIO_PROCESS__ISOLATE=false") as refused:
        await backend.launch(plan)
    assert refused.value.retryable is False
    assert not plan.host_dir.exists()  # nothing was started


async def test_isolation_off_does_not_need_bubblewrap(refusing_bwrap: Path, tmp_path: Path) -> None:
    backend = ProcessBackend(tmp_path / "sandboxes", ProcessSettings(isolate=False))
    health = await backend.health()
    assert health.ok is True
    assert health.detail["isolation"] == "none"
