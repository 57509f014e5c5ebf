"""What the log says now about the models an activation's agent calls, and the providers they
are called through: the credential desk and the model relay answer only for these."""

from __future__ import annotations

from suzumio.contracts.events import AgentCreated, AgentUpdated, ProviderRemoved, ProviderSet
from suzumio.contracts.values import ModelSpec, ProviderSpec
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.state import Broker


async def model_chain(broker: Broker, caller: Caller) -> tuple[ModelSpec, ...]:
    """The caller's agent's model and fallbacks as the log holds them now; none when the agent
    is not of the token's project."""
    chain: tuple[ModelSpec, ...] = ()
    project_id: str | None = None
    for event in (await broker.store.load("agent", caller.claims.agent_id)).events:
        data = event.data
        if isinstance(data, AgentCreated):
            project_id, chain = data.project_id, (data.model, *data.fallbacks)
        elif isinstance(data, AgentUpdated) and chain:
            chain = (
                data.model if data.model is not None else chain[0],
                *(data.fallbacks if data.fallbacks is not None else chain[1:]),
            )
    return chain if project_id == caller.claims.project_id else ()


async def provider_of(broker: Broker, project_id: str, name: str) -> ProviderSpec | None:
    """The project's provider `name` as the log holds it now."""
    spec: ProviderSpec | None = None
    for event in (await broker.store.load("project", project_id)).events:
        data = event.data
        if isinstance(data, ProviderSet) and data.name == name:
            spec = data.spec
        elif isinstance(data, ProviderRemoved) and data.name == name:
            spec = None
    return spec
