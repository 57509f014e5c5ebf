"""Resealing a provider's key (secret-key rotation): the session service stores the key sealed
again only while the stored one is still the one that was read."""

from __future__ import annotations

import pytest

from suzumio.contracts.commands import ResealProviderKey
from suzumio.contracts.errors import ConflictError, NotFoundError
from suzumio.contracts.events import ProviderSet
from suzumio.contracts.values import ModelSpec, ProviderSpec
from suzumio.platform.secrets import SecretBox, SecretError
from suzumio.session.domain import project
from suzumio.session.domain.project import ProjectState

OLD, NEW = SecretBox.generate_key(), SecretBox.generate_key()


def _state(spec: ProviderSpec) -> ProjectState:
    state = ProjectState("p")
    state.providers["main"] = spec
    return state


def _spec(box: SecretBox, key: str) -> ProviderSpec:
    return ProviderSpec(
        base_url="https://llm.example.com/v1",
        model="m",
        fallbacks=(ModelSpec(name="small"),),
        api_key=box.seal(key),
    )


def test_the_key_sealed_again_is_stored_with_everything_else_unchanged() -> None:
    stored = _spec(SecretBox([OLD]), "sk-1")
    assert stored.api_key is not None
    rotating = SecretBox([NEW, OLD])
    resealed = rotating.reseal(stored.api_key)
    command = ResealProviderKey(
        project_id="p", name="main", previous=stored.api_key, api_key=resealed
    )
    [event] = project.reseal_provider_key(_state(stored), command)
    assert isinstance(event, ProviderSet)
    assert event.spec == stored.model_copy(update={"api_key": resealed})
    assert event.spec.api_key is not None
    assert SecretBox([NEW]).open(event.spec.api_key) == "sk-1"  # the old key is not needed
    with pytest.raises(SecretError):
        SecretBox([OLD]).open(event.spec.api_key)


def test_a_key_set_since_it_was_read_is_not_replaced() -> None:
    old_box, rotating = SecretBox([OLD]), SecretBox([NEW, OLD])
    read = _spec(old_box, "sk-1").api_key
    assert read is not None
    now = _spec(old_box, "sk-2")  # a user set another key meanwhile
    command = ResealProviderKey(
        project_id="p", name="main", previous=read, api_key=rotating.reseal(read)
    )
    with pytest.raises(ConflictError):
        project.reseal_provider_key(_state(now), command)


def test_a_retry_of_an_applied_reseal_changes_nothing() -> None:
    rotating = SecretBox([NEW, OLD])
    before = _spec(SecretBox([OLD]), "sk-1")
    assert before.api_key is not None
    resealed = rotating.reseal(before.api_key)
    after = before.model_copy(update={"api_key": resealed})
    command = ResealProviderKey(
        project_id="p", name="main", previous=before.api_key, api_key=resealed
    )
    assert project.reseal_provider_key(_state(after), command) == []


def test_a_removed_provider_is_not_found() -> None:
    box = SecretBox([OLD])
    secret = box.seal("sk-1")
    command = ResealProviderKey(project_id="p", name="main", previous=secret, api_key=secret)
    with pytest.raises(NotFoundError):
        project.reseal_provider_key(ProjectState("p"), command)


def test_a_secret_no_configured_key_opens_cannot_be_resealed() -> None:
    secret = SecretBox([OLD]).seal("sk-1")
    with pytest.raises(SecretError):
        SecretBox([NEW]).reseal(secret)
