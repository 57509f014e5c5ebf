"""An agent's assets are bounded alike when it is created and when it is changed: a change
could otherwise carry a list no create may, and its refusal (one error per item) would not fit
on the bus."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from suzumio.contracts.commands import CreateAgent, UpdateAgent
from suzumio.contracts.values import AssetRef

ASSETS_MAX = 10_000


def assets(n: int) -> tuple[AssetRef, ...]:
    return tuple(AssetRef(path=f"a/{i}.txt", sha256="0" * 64, size=1) for i in range(n))


@pytest.mark.parametrize("command", [CreateAgent, UpdateAgent])
def test_assets_past_the_bound_are_refused(command: type[CreateAgent | UpdateAgent]) -> None:
    fields = {"agent_id": "a" * 26, "assets": assets(ASSETS_MAX + 1)}
    with pytest.raises(ValidationError, match="at most 10000 items"):
        command.model_validate(fields, strict=False)


def test_assets_up_to_the_bound_are_taken() -> None:
    assert len(UpdateAgent(agent_id="a" * 26, assets=assets(ASSETS_MAX)).assets or ()) == ASSETS_MAX
