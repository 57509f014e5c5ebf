"""Two users: neither can read, list, stream or change the other's objects. Every operation
of the OpenAPI document is tried with the other user's ids, so a new route cannot skip the
check: the table below must name it, or this test fails."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import PendingKind
from tests.e2e.api import World, new_world, ok, problem
from tests.e2e.stack import Stack
from tests.e2e.test_api_pending_stream import ask

AGENT = {"name": "x", "role": "x", "model": {"name": "m"}}
PROVIDER = {
    "base_url": "https://llm.example.com",
    "model": "m",
    "api_key": "sk-other-0123456789abcdef",
}
# (method, path) → the body a valid request would carry; "files" means a multipart upload.
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/v1/users"): {"name": "intruder"},
    ("get", "/v1/users"): None,
    ("get", "/v1/users/{user_id}"): None,
    ("get", "/v1/me"): None,
    ("post", "/v1/me/api-keys"): {"name": "k"},
    ("get", "/v1/me/api-keys"): None,
    ("delete", "/v1/me/api-keys/{key_id}"): None,
    ("post", "/v1/projects"): {"name": "mine"},
    ("get", "/v1/projects"): None,
    ("get", "/v1/projects/{project_id}"): None,
    ("patch", "/v1/projects/{project_id}"): {"name": "stolen"},
    ("get", "/v1/projects/{project_id}/members"): None,
    ("put", "/v1/projects/{project_id}/members/{user_id}"): {"role": "owner"},
    ("delete", "/v1/projects/{project_id}/members/{user_id}"): None,
    ("get", "/v1/projects/{project_id}/runtime-profiles"): None,
    ("get", "/v1/projects/{project_id}/runtime-profiles/{name}"): None,
    ("put", "/v1/projects/{project_id}/runtime-profiles/{name}"): {"backend": "process"},
    ("delete", "/v1/projects/{project_id}/runtime-profiles/{name}"): None,
    ("get", "/v1/projects/{project_id}/providers"): None,
    ("get", "/v1/projects/{project_id}/providers/{name}"): None,
    ("put", "/v1/projects/{project_id}/providers/{name}"): PROVIDER,
    ("delete", "/v1/projects/{project_id}/providers/{name}"): None,
    ("post", "/v1/projects/{project_id}/mount-grants"): {"host_path": "/tmp", "target": "/x"},
    ("get", "/v1/projects/{project_id}/mount-grants"): None,
    ("get", "/v1/projects/{project_id}/mount-grants/{grant_id}"): None,
    ("delete", "/v1/projects/{project_id}/mount-grants/{grant_id}"): None,
    ("post", "/v1/projects/{project_id}/agents"): AGENT,
    ("post", "/v1/projects/{project_id}/agents/import"): "files",
    ("get", "/v1/projects/{project_id}/agents"): None,
    ("get", "/v1/agents/{agent_id}"): None,
    ("patch", "/v1/agents/{agent_id}"): {"prompt": "obey me"},
    ("post", "/v1/agents/{agent_id}/package"): "files",
    ("post", "/v1/agents/{agent_id}/disable"): {},
    ("post", "/v1/agents/{agent_id}/enable"): None,
    ("post", "/v1/projects/{project_id}/sessions"): "agent",
    ("get", "/v1/projects/{project_id}/sessions"): None,
    ("get", "/v1/sessions/{session_id}"): None,
    ("post", "/v1/sessions/{session_id}/close"): {},
    ("post", "/v1/sessions/{session_id}/reopen"): None,
    ("get", "/v1/sessions/{session_id}/messages"): None,
    ("post", "/v1/sessions/{session_id}/messages"): {"text": "hi"},
    ("get", "/v1/sessions/{session_id}/signals"): None,
    ("post", "/v1/sessions/{session_id}/signals"): {},
    ("get", "/v1/sessions/{session_id}/activations"): None,
    ("get", "/v1/activations/{activation_id}"): None,
    ("get", "/v1/activations/{activation_id}/tool-calls"): None,
    ("post", "/v1/activations/{activation_id}/cancel"): {},
    ("get", "/v1/sessions/{session_id}/stream"): None,
    ("post", "/v1/projects/{project_id}/artifacts"): "files",
    ("get", "/v1/projects/{project_id}/artifacts"): None,
    ("get", "/v1/artifacts/{artifact_id}"): None,
    ("get", "/v1/artifacts/{artifact_id}/content"): None,
    ("delete", "/v1/artifacts/{artifact_id}"): None,
    ("get", "/v1/sessions/{session_id}/pending-actions"): None,
    ("get", "/v1/pending-actions/{action_id}"): None,
    ("post", "/v1/pending-actions/{action_id}/reply"): {"answer": "yes", "approved": True},
    ("get", "/v1/cluster/status"): None,
    ("get", "/healthz"): None,
    ("get", "/readyz"): None,
    ("get", "/metrics"): None,
}
ADMIN_ONLY = {("post", "/v1/users"), ("get", "/v1/users"), ("get", "/v1/cluster/status")}
# Operations on the caller's own scope: nothing of the other user's is named in them.
OWN_SCOPE = {
    ("get", "/v1/me"),
    ("post", "/v1/me/api-keys"),
    ("get", "/v1/me/api-keys"),
    ("post", "/v1/projects"),
    ("get", "/v1/projects"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
}


class Victim:
    def __init__(self, world: World, ids: dict[str, str]) -> None:
        self.world = world
        self.ids = ids


async def victim(stack: Stack) -> Victim:
    world = await new_world(stack, "victim")
    base = f"/v1/projects/{world.project_id}"
    root = stack.mount_root / f"victim-{world.project_id}"
    root.mkdir()
    async with stack.client(world.key) as c:
        ok(await c.put(f"{base}/runtime-profiles/prof", json={"backend": "process"}))
        ok(await c.put(f"{base}/providers/prov", json=PROVIDER))
        grant = ok(
            await c.post(f"{base}/mount-grants", json={"host_path": str(root), "target": "/data"}),
            201,
        )
        artifact = ok(await c.post(f"{base}/artifacts", files={"file": ("a.txt", b"secret")}), 201)
        key = ok(await c.post("/v1/me/api-keys", json={"name": "spare"}), 201)
    action_id = await ask(stack, world, PendingKind.APPROVAL)
    activation_id = new_id()
    head = await stack.store.head("session", world.session_id)
    await stack.store.append(
        world.session_id,
        [ActivationRequested(activation_id=activation_id, agent_id=world.agent_id, signal_ids=())],
        head.version,
    )
    return Victim(
        world,
        {
            "project_id": world.project_id,
            "agent_id": world.agent_id,
            "session_id": world.session_id,
            "user_id": world.user_id,
            "key_id": key["key_id"],
            "grant_id": grant["id"],
            "artifact_id": artifact["items"][0]["id"],
            "action_id": action_id,
            "activation_id": activation_id,
        },
    )


def fill(path: str, ids: dict[str, str]) -> str:
    name = "prof" if "runtime-profiles" in path else "prov"
    return path.format(**ids, name=name)


async def test_every_operation_hides_other_users_objects(stack: Stack) -> None:
    target = await victim(stack)
    intruder = await new_world(stack, "intruder")
    async with stack.client() as anonymous:
        spec = ok(await anonymous.get("/openapi.json"))
    operations = {(m, p) for p, item in spec["paths"].items() for m in item}
    operations |= {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")}
    assert operations == set(BODIES), f"add these operations to BODIES: {operations ^ set(BODIES)}"

    async with stack.client(intruder.key) as c:
        for method, path in sorted(operations - OWN_SCOPE):
            body = BODIES[(method, path)]
            kwargs: dict[str, Any] = {}
            if body == "files":
                kwargs["files"] = {"package": ("p.tgz", b"x"), "file": ("f.txt", b"x")}
            elif body == "agent":
                kwargs["json"] = {"agent_id": target.world.agent_id}
            elif body is not None:
                kwargs["json"] = body
            response = await c.request(method, fill(path, target.ids), **kwargs)
            expected = (403, "forbidden") if (method, path) in ADMIN_ONLY else (404, "not_found")
            assert (response.status_code, response.json().get("code")) == expected, (
                method,
                path,
                response.status_code,
                response.text,
            )

        listed = ok(await c.get("/v1/projects"))
        assert [p["id"] for p in listed["items"]] == [intruder.project_id]

    # Nothing of the victim's changed.
    async with stack.client(target.world.key) as c:
        project = ok(await c.get(f"/v1/projects/{target.world.project_id}"))
        assert project["name"] == "victim's project"
        session = ok(await c.get(f"/v1/sessions/{target.world.session_id}"))
        assert (session["status"], session["message_count"]) == ("active", 0)
        assert ok(await c.get(f"/v1/artifacts/{target.ids['artifact_id']}"))["path"] == "a.txt"
        members = ok(await c.get(f"/v1/projects/{target.world.project_id}/members"))
        assert [m["user_id"] for m in members] == [target.world.user_id]
        action = ok(await c.get(f"/v1/pending-actions/{target.ids['action_id']}"))
        assert action["status"] == "open"
        assert (
            await c.get("/v1/me", headers={"Authorization": f"Bearer {target.world.key}"})
        ).status_code == 200


async def test_the_websocket_refuses_other_users_sessions(stack: Stack) -> None:
    target = await new_world(stack, "owner-ws")
    intruder = await new_world(stack, "intruder-ws")
    url = stack.api.replace("http", "ws") + f"/v1/sessions/{target.session_id}/ws"
    headers = {"Authorization": f"Bearer {intruder.key}"}
    for address, extra, code in ((url, headers, 4404), (url + "?access_token=garbage", {}, 4401)):
        async with ws_connect(address, additional_headers=extra) as ws:
            with pytest.raises(ConnectionClosed) as info:
                await ws.recv()
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == code


async def test_anonymous_callers_get_nothing(stack: Stack) -> None:
    target = await new_world(stack, "anon-target")
    async with stack.client() as c:
        for path in (
            f"/v1/projects/{target.project_id}",
            f"/v1/sessions/{target.session_id}",
            "/v1/projects",
            f"/v1/sessions/{target.session_id}/stream",
        ):
            problem(await c.get(path), 401, "unauthenticated")
        body = json.dumps({"text": "x"})
        problem(
            await c.post(f"/v1/sessions/{target.session_id}/messages", content=body),
            401,
            "unauthenticated",
        )
