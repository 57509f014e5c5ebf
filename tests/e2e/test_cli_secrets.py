"""`suzumio secrets reseal`: a secret-key rotation through the real CLI, against the real
session service and gateway on NATS and Postgres. Provider keys set through the API (sealed
with the old key) end up sealed with the new one, readable without the old key; nothing else
about the providers changes, a second run has nothing to do, and keys no configured key opens
are named and left as they are."""

from __future__ import annotations

from pathlib import Path

from suzumio.contracts.events import ProviderRemoved, ProviderSet
from suzumio.contracts.values import ProviderSpec
from suzumio.platform.secrets import SecretBox, key_id
from tests.e2e.api import new_world, ok
from tests.e2e.stack import Stack, running_stack
from tests.e2e.test_cli_review import env_of, suzumio

KEYS = {"main": "sk-rotate-main-0123456789", "second": "sk-rotate-second-0123456789"}


async def _providers(stack: Stack, project_id: str) -> tuple[int, dict[str, ProviderSpec]]:
    stream = await stack.store.load("project", project_id)
    specs: dict[str, ProviderSpec] = {}
    for event in stream.events:
        match event.data:
            case ProviderSet(name=name, spec=spec):
                specs[name] = spec
            case ProviderRemoved(name=name):
                specs.pop(name, None)
    return len(stream.events), specs


async def test_a_rotation_seals_every_provider_key_again(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    # A stack of its own: the command reseals every project in its namespace.
    async with running_stack(nats_url, postgres_url, tmp_path, ("session", "gateway")) as stack:
        world = await new_world(stack, "rotation")
        base = f"/v1/projects/{world.project_id}/providers"
        async with stack.client(world.key) as c:
            for name, key in KEYS.items():
                body = {"base_url": "https://llm.example.com/v1", "model": "m", "api_key": key}
                ok(await c.put(f"{base}/{name}", json=body))
            body = {"base_url": "https://other.example.com/v1", "model": "m"}
            ok(await c.put(f"{base}/keyless", json=body))
        before_count, before = await _providers(stack, world.project_id)
        old, new = stack.secret_key, SecretBox.generate_key()
        env = env_of(stack.nats_url, stack.database_url, stack.topology) | {
            "SUZUMIO_DATA_DIR": str(tmp_path / "cli")
        }

        dry = await suzumio(
            "secrets", "reseal", "--dry-run", **env, SUZUMIO_SECRET_KEY=f"{new},{old}"
        )
        assert dry.returncode == 0, dry.stderr + dry.stdout
        assert "2 provider key(s) would be sealed again" in dry.stdout
        assert (await _providers(stack, world.project_id))[0] == before_count  # nothing stored

        run = await suzumio("secrets", "reseal", **env, SUZUMIO_SECRET_KEY=f"{new},{old}")
        assert run.returncode == 0, run.stderr + run.stdout
        assert "2 provider key(s) sealed again" in run.stdout
        count, after = await _providers(stack, world.project_id)
        assert count == before_count + 2
        only_new = SecretBox([new])
        for name, key in KEYS.items():
            sealed = after[name].api_key
            assert sealed is not None
            assert sealed.key_id == key_id(new)
            assert only_new.open(sealed) == key  # the old key is no longer needed
            assert after[name].model_copy(update={"api_key": None}) == before[name].model_copy(
                update={"api_key": None}
            )
        assert after["keyless"] == before["keyless"]
        assert not [k for k in KEYS.values() if k in run.stdout + run.stderr]

        again = await suzumio("secrets", "reseal", **env, SUZUMIO_SECRET_KEY=f"{new},{old}")
        assert again.returncode == 0, again.stderr + again.stdout
        assert "0 provider key(s) sealed again" in again.stdout
        assert "2 already sealed with it" in again.stdout
        assert (await _providers(stack, world.project_id))[0] == count

        # A key that opens none of them: each is named, none is touched, the command fails.
        other = SecretBox.generate_key()
        refused = await suzumio("secrets", "reseal", **env, SUZUMIO_SECRET_KEY=other)
        assert refused.returncode == 1, refused.stderr + refused.stdout
        assert "2 provider key(s) cannot be opened" in refused.stderr + refused.stdout
        assert (await _providers(stack, world.project_id))[0] == count


async def test_a_secret_key_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    result = await suzumio(
        "secrets", "reseal", SUZUMIO_SECRET_KEY="not-a-key", SUZUMIO_DATA_DIR=str(tmp_path)
    )
    assert result.returncode == 2, result.stderr + result.stdout
    assert "SUZUMIO_SECRET_KEY" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
