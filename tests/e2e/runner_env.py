"""Shared pieces of the runner tests: the launcher bound to a platform stack, posting."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.ids import new_id
from suzumio.platform.tokens import TokenSigner
from suzumio.testing.model_server import ScriptedModelServer
from tests.e2e.api import World, ok
from tests.e2e.stack import Stack
from tests.runner_support import RunnerLauncher


def launcher(
    stack: Stack, model: ScriptedModelServer, tmp_path: Path, world: World, **kw: Any
) -> RunnerLauncher:
    """Runs the activations of `world`'s session only."""
    return RunnerLauncher(
        stack.nc,
        stack.topology,
        stack.store,
        stack.secret_key,
        stack.url_of("toolbroker"),
        model.url,
        tmp_path,
        session_id=world.session_id,
        **kw,
    )


async def post(stack: Stack, world: World, text: str, **extra: Any) -> dict[str, Any]:
    async with stack.client(world.key) as c:
        body: dict[str, Any] = ok(
            await c.post(f"/v1/sessions/{world.session_id}/messages", json={"text": text, **extra}),
            201,
        )
    return body


async def request_activation(stack: Stack, world: World) -> str:
    """Append the scheduler's decision directly, as the scheduler would."""
    activation_id = new_id()
    await stack.store.append_next(
        world.session_id,
        [
            ActivationRequested(
                activation_id=activation_id,
                agent_id=world.agent_id,
                signal_ids=(),
                project_id=world.project_id,
            )
        ],
        EventMeta(actor="system:scheduler"),
    )
    return activation_id


def token_of(stack: Stack, world: World, activation_id: str) -> str:
    """A token of `activation_id` in `world`'s session, as the orchestrator signs one."""
    return TokenSigner([stack.secret_key]).issue(
        activation_id=activation_id,
        session_id=world.session_id,
        project_id=world.project_id,
        agent_id=world.agent_id,
        ttl=timedelta(minutes=5),
    )
