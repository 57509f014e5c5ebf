"""Input the API must refuse with a 4xx problem before anything is recorded: times a timestamp
column or the scheduler cannot hold, YAML that expands or nests without end, half-valid
uploads, forged cursors and bodies larger than the bus carries."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from typing import Any

from tests.e2e.api import new_world, ok, problem, tar_gz
from tests.e2e.stack import Stack

MANIFEST = b"name: bomb\nrole: r\nmodel: m\n"


async def test_signal_times_must_be_aware_and_in_range(stack: Stack) -> None:
    world = await new_world(stack, "tia")
    url = f"/v1/sessions/{world.session_id}/signals"
    async with stack.client(world.key) as c:
        for not_before in (
            "2030-01-01T00:00:00",  # no timezone: the scheduler compares with aware times
            "0001-01-01T00:00:00+01:00",  # year 0 in UTC: no timestamptz column holds it
            "9999-12-31T23:30:00-01:00",  # year 10000 in UTC
            "1999-12-31T23:59:59Z",
        ):
            body = problem(
                await c.post(url, json={"kind": "timer", "not_before": not_before}),
                422,
                "invalid",
            )
            assert body["errors"][0]["loc"].endswith("not_before"), body
        accepted = ok(
            await c.post(url, json={"kind": "timer", "not_before": "2030-01-01T01:00:00+01:00"}),
            201,
        )
        assert accepted["not_before"].startswith("2030-01-01T00:00:00")
        listed = ok(await c.get(url))
        assert [s["id"] for s in listed["items"]] == [accepted["id"]]  # the refused left nothing


async def test_signal_payloads_are_bounded(stack: Stack) -> None:
    world = await new_world(stack, "uma")
    url = f"/v1/sessions/{world.session_id}/signals"
    async with stack.client(world.key) as c:
        problem(await c.post(url, json={"payload": {"blob": "x" * 300_000}}), 422, "invalid")
        huge = await c.post(url, json={"payload": {"blob": "x" * 9_000_000}})
        assert huge.status_code in {413, 422}, huge.text  # a body limit may refuse it first
        assert huge.headers["content-type"].startswith("application/problem+json")
        assert ok(await c.get(url))["items"] == []


async def test_a_command_larger_than_the_bus_carries_is_413(stack: Stack) -> None:
    world = await new_world(stack, "val")
    async with stack.client(world.key) as c:
        body = {
            "name": "huge",
            "role": "r",
            "model": {"name": "m"},
            # Each fact within its bound, all of them together larger than a message.
            "env_facts": {f"fact{i}": "x" * 9_500 for i in range(1_000)},
        }
        problem(
            await c.post(f"/v1/projects/{world.project_id}/agents", json=body), 413, "too_large"
        )
        agents = ok(await c.get(f"/v1/projects/{world.project_id}/agents"))["items"]
        assert [a["name"] for a in agents] == ["helper"]


async def test_an_agents_lists_and_maps_are_bounded(stack: Stack) -> None:
    world = await new_world(stack, "vim")
    base = {"name": "big", "role": "r", "model": {"name": "m"}}
    too_much: tuple[dict[str, Any], ...] = (
        {"env_facts": {f"f{i}": "v" for i in range(1_001)}},
        {"env_facts": {"k": "v" * 10_001}},
        {"env_facts": {"k" * 10_001: "v"}},
        {"tools": ["t" * 201]},
        {"toolpacks": ["p" * 201]},
        {"permissions": {"t" * 201: "allow"}},
        {"permissions": {f"t{i}": "allow" for i in range(501)}},
    )
    async with stack.client(world.key) as c:
        agents = f"/v1/projects/{world.project_id}/agents"
        for extra in too_much:
            problem(await c.post(agents, json=base | extra), 422, "invalid")
        patch = f"/v1/agents/{world.agent_id}"
        for extra in (
            *too_much,
            {"tools": [f"t{i}" for i in range(201)]},
            {"fallbacks": [{"name": "m"}] * 17},
        ):
            problem(await c.patch(patch, json=extra), 422, "invalid")
        assert [a["name"] for a in ok(await c.get(agents))["items"]] == ["helper"]
        assert ok(await c.get(patch))["env_facts"] == {}
        imports = f"{agents}/import"
        for files in (
            {
                "agent.yaml": MANIFEST,
                "tools.yaml": "\n".join(f"- t{i}" for i in range(201)).encode(),
            },
            {"agent.yaml": MANIFEST + b"tools: [" + b"t" * 201 + b"]\n"},
            {"agent.yaml": MANIFEST, "prompt/system.md": b"p" * 1_000_001},
            {"agent.yaml": MANIFEST, "prompt/system.md": b"a NUL \x00 in the prompt"},
        ):
            problem(
                await c.post(imports, files={"package": ("p.tgz", tar_gz(files))}), 422, "invalid"
            )
        assert [a["name"] for a in ok(await c.get(agents))["items"]] == ["helper"]


def billion_laughs(levels: int = 7) -> bytes:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


async def test_package_yaml_may_not_alias_or_nest_without_end(stack: Stack) -> None:
    world = await new_world(stack, "wes")
    url = f"/v1/projects/{world.project_id}/agents/import"
    bad = (
        {"agent.yaml": MANIFEST, "env/env_facts.yaml": billion_laughs()},
        {"agent.yaml": MANIFEST, "env/env_facts.yaml": b"a: &x one\nb: *x\n"},
        {"agent.yaml": MANIFEST, "tools.yaml": b"[" * 50_000},
        {"agent.yaml": MANIFEST + b"tools: " + b"[" * 50_000 + b"]" * 50_000 + b"\n"},
        {"agent.yaml": MANIFEST, "env/env_facts.yaml": b"nested: {deep: [1, 2]}\n"},
        {"agent.yaml": MANIFEST, "env/env_facts.yaml": b"k: " + b"v" * 2_000_000 + b"\n"},
    )
    async with stack.client(world.key) as c:
        for files in bad:
            problem(await c.post(url, files={"package": ("p.tgz", tar_gz(files))}), 422, "invalid")
        agents = ok(await c.get(f"/v1/projects/{world.project_id}/agents"))["items"]
        assert [a["name"] for a in agents] == ["helper"]


async def test_a_refused_part_leaves_the_whole_upload_unrecorded(stack: Stack) -> None:
    world = await new_world(stack, "xia")
    base = f"/v1/projects/{world.project_id}/artifacts"
    async with stack.client(world.key) as c:
        for second in (
            ("\\x.txt", b"b", "text/plain"),  # a leading backslash is an absolute path
            ("a" * 1_001, b"b", "text/plain"),
            ("fine.txt", b"b", "t" * 100 + "/" + "s" * 120),  # longer than RecordArtifact takes
        ):
            files = [("file", ("ok.txt", b"a", "text/plain")), ("file", second)]
            problem(await c.post(base, files=files), 422, "invalid")
        problem(
            await c.post(base, files={"file": ("ok.txt", b"a")}, data={"session_id": "a\x00b"}),
            422,
            "invalid",
        )
        assert ok(await c.get(base))["items"] == []
        # A backslash elsewhere is a Windows separator, kept as '/'.
        stored = ok(await c.post(base, files={"file": ("docs\\a.txt", b"a")}), 201)
        assert [i["path"] for i in stored["items"]] == ["docs/a.txt"]


async def test_a_cursor_no_timestamp_column_can_hold_is_422(stack: Stack) -> None:
    world = await new_world(stack, "yul")
    async with stack.client(world.key) as c:
        for moment in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-01:00"):
            raw = json.dumps([moment, "x"]).encode()
            cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
            problem(await c.get("/v1/projects", params={"cursor": cursor}), 422, "invalid")
        cursor = "WyIwMDAxLTAxLTAxVDAwOjAwOjAwKzAxOjAwIiwgIngiXQ"  # the one the review found
        problem(await c.get("/v1/projects", params={"cursor": cursor}), 422, "invalid")
        nul = base64.urlsafe_b64encode(json.dumps(["2030-01-01T00:00:00+00:00", "x\x00"]).encode())
        problem(await c.get("/v1/projects", params={"cursor": nul.decode()}), 422, "invalid")


async def test_a_request_head_over_16_kb_is_refused_before_the_app(stack: Stack) -> None:
    """Headers are read whole before any limit of the app applies: the server bounds them
    (`BoundedHttpToolsProtocol`), so a stranger cannot make a service hold (and parse)
    headers of any size."""
    host, port = stack.api.removeprefix("http://").split(":")
    for head in (b"X-Big: " + b"a" * 1_000_000, b"\r\n".join([b"X-Many: b"] * 20_000)):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /v1/projects HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            answer = await asyncio.wait_for(reader.read(200), 10)
        finally:
            writer.close()
        # Refused with a 4xx, or the connection closed, before any route answers.
        assert answer == b"" or answer.split(b" ")[1].startswith(b"4"), answer[:100]
        assert b" 401 " not in answer  # the auth of the route never saw it


async def test_a_typo_inside_a_nested_body_is_refused_not_read_as_the_default(
    stack: Stack,
) -> None:
    """Before, `limits` and `model` took unknown fields silently: a misspelt limit set the
    project's to the default, a misspelt provider sent the agent's prompts to the default one."""
    world = await new_world(stack, "wes")
    async with stack.client(world.key) as c:
        project = f"/v1/projects/{world.project_id}"
        ok(await c.patch(project, json={"limits": {"max_concurrent_activations": 2}}))
        typo = {"limits": {"max_concurent_activations": 5}}
        body = problem(await c.patch(project, json=typo), 422, "invalid")
        assert "max_concurent_activations" in str(body)
        assert ok(await c.get(project))["limits"]["max_concurrent_activations"] == 2
        agents = f"{project}/agents"
        misspelt = {"name": "m2", "role": "r", "model": {"name": "m", "provder": "eu"}}
        problem(await c.post(agents, json=misspelt), 422, "invalid")
        agent = f"/v1/agents/{world.agent_id}"
        before = ok(await c.get(agent))
        problem(
            await c.patch(agent, json={"model": {"name": "m", "provder": "eu"}}), 422, "invalid"
        )
        problem(await c.patch(agent, json={"fallbacks": [{"nam": "m"}]}), 422, "invalid")
        assert ok(await c.get(agent)) == before
        assert [a["name"] for a in ok(await c.get(agents))["items"]] == ["helper"]
