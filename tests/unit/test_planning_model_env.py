"""A sandbox gets the model keys its agent's models use and nothing else (DESIGN.md §7): the
server's default endpoint and key only when one of the agent's models names no provider."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from suzumio.contracts.values import ModelSpec, ProviderSpec
from suzumio.orchestrator.directory import Agent, Project
from suzumio.orchestrator.planning import Planner
from suzumio.orchestrator.settings import OrchestratorSettings

DEFAULT_KEY = "sk-server-default"


def planner() -> Planner:
    settings = OrchestratorSettings(
        model_base_url="http://127.0.0.1:9/v1", model_api_key=SecretStr(DEFAULT_KEY)
    )
    nothing: Any = None
    return Planner(store=nothing, signer=nothing, box=None, settings=settings)


PROJECT = Project(
    id="p1", providers={"acme": ProviderSpec(base_url="http://127.0.0.1:9/acme", model="m")}
)


def test_an_agent_whose_models_all_name_a_provider_gets_no_default_key() -> None:
    agent = Agent(
        id="a1",
        model=ModelSpec(name="m", provider="acme"),
        fallbacks=(ModelSpec(name="n", provider="acme"),),
    )
    env, secrets = planner()._model_env(agent, PROJECT)
    assert "SUZUMIO_MODEL_API_KEY" not in env
    assert "SUZUMIO_MODEL_BASE_URL" not in env
    assert DEFAULT_KEY not in env.values()
    assert env["SUZUMIO_PROVIDER_ACME_BASE_URL"] == "http://127.0.0.1:9/acme"
    assert secrets == set()


def test_a_fallback_without_a_provider_brings_the_default_endpoint() -> None:
    agent = Agent(
        id="a1", model=ModelSpec(name="m", provider="acme"), fallbacks=(ModelSpec(name="n"),)
    )
    env, secrets = planner()._model_env(agent, PROJECT)
    assert env["SUZUMIO_MODEL_API_KEY"] == DEFAULT_KEY
    assert env["SUZUMIO_MODEL_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert secrets == {"SUZUMIO_MODEL_API_KEY"}
