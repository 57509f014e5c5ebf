"""Tool permission policies as the runner and the tool-broker both read them, and what of them
an activation's token carries: the policy of the tools whose effect the broker makes, where it
is not `allow` — named as the model sees a tool too, the stricter policy holding."""

from __future__ import annotations

import asyncio
from pathlib import Path

from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.policies import BROKER_TOOLS, broker_policies, effective_policy
from suzumio.contracts.values import ToolPolicy
from suzumio.orchestrator.directory import Agent, Project
from suzumio.orchestrator.planning import Planner
from suzumio.orchestrator.sessions import SessionSnapshot
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.secrets import SecretBox
from suzumio.platform.tokens import TokenSigner

ALLOW, ASK, DENY = ToolPolicy.ALLOW, ToolPolicy.ASK, ToolPolicy.DENY


def test_a_tool_named_both_ways_takes_the_stricter_policy() -> None:
    permissions = {"message.send": ASK, "message_send": DENY, "shell_exec": ASK}
    assert effective_policy(permissions, ALLOW, "message.send") is DENY
    assert effective_policy(permissions, ALLOW, "shell.exec") is ASK
    assert effective_policy(permissions, DENY, "file.read") is DENY  # the default


def test_the_token_carries_only_the_broker_tools_not_simply_allowed() -> None:
    permissions = {
        "message_send": DENY,
        "checkpoint": ASK,
        "ask_user": ALLOW,
        "shell.exec": DENY,  # the runner's own: the broker never sees it run
    }
    assert broker_policies(permissions) == {"message.send": DENY, "checkpoint": ASK}
    assert broker_policies({}, DENY) == dict.fromkeys(BROKER_TOOLS, DENY)


def test_the_orchestrator_signs_the_agents_broker_policies_into_the_token(
    tmp_path: Path,
) -> None:
    signer = TokenSigner([SecretBox.generate_key()])
    settings = OrchestratorSettings(work_dir=tmp_path)
    planner = Planner(store=None, signer=signer, box=None, settings=settings)  # type: ignore[arg-type]

    async def snapshot(*_: object) -> SessionSnapshot:
        return SessionSnapshot(project_id="p1", history=(), signals=(), checkpoint=None)

    planner._sessions.snapshot = snapshot  # type: ignore[method-assign, assignment]
    agent = Agent(id="a1", project_id="p1", permissions={"signal.record": DENY, "file.read": ASK})
    request = ActivationRequested(activation_id="act1", agent_id="a1", signal_ids=())
    plan = asyncio.run(planner.plan("s1", request, agent, Project(id="p1")))
    claims = signer.verify(plan.input.token)
    assert claims.policies == {"signal.record": DENY}
    assert plan.input.permissions == {"signal.record": DENY, "file.read": ASK}
