"""The default model endpoint from OpenAI's own variables: `suzumio up` takes OPENAI_API_KEY
for a configured model (its demo model off), and the runner takes it too, but the orchestrator
read only SUZUMIO_MODEL_*: its sandboxes got no key, every agent without a provider failed."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from suzumio.orchestrator.settings import OrchestratorSettings


def test_openai_variables_stand_in_for_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SUZUMIO_MODEL_API_KEY", "SUZUMIO_MODEL_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example/v1")
    settings = OrchestratorSettings()
    assert settings.model_api_key is not None
    assert settings.model_api_key.get_secret_value() == "sk-from-openai"
    assert settings.model_base_url == "https://proxy.example/v1"
    # Ours come first; code may still name the fields.
    monkeypatch.setenv("SUZUMIO_MODEL_API_KEY", "ours")
    ours = OrchestratorSettings().model_api_key
    assert ours is not None
    assert ours.get_secret_value() == "ours"
    given = OrchestratorSettings(model_api_key=SecretStr("given")).model_api_key
    assert given is not None
    assert given.get_secret_value() == "given"
