"""Network profile `none` on the docker backend (DESIGN.md §10): the container has no network
but loopback, its runner reaches the tool-broker through the broker's Unix socket mounted in,
and its model through the broker's relay, which calls the endpoint with a key the sandbox never
holds. Against a real engine and the real runner image, the real session, scheduler,
tool-broker and gateway processes; the model is the scripted server (the one allowed fake).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker  # type: ignore[import-untyped]
import httpx
import pytest
import pytest_asyncio

from suzumio.contracts.commands import SetRuntimeProfile, UpdateAgent
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import Backend as BackendName
from suzumio.contracts.values import ModelSpec, NetworkProfile, RuntimeProfileSpec
from suzumio.orchestrator.backends.base import LABEL_PREFIX, Backend
from suzumio.orchestrator.backends.docker import DockerBackend, DockerSettings
from suzumio.orchestrator.backends.process import ProcessBackend, ProcessSettings
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.tokens import TokenSigner
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall, error_body
from tests.backend_suite import harness
from tests.e2e.api import World, new_world, ok
from tests.e2e.conftest import PLATFORM_SERVICES
from tests.e2e.runner_env import request_activation, token_of
from tests.e2e.stack import Stack, running_stack
from tests.support import eventually

pytestmark = pytest.mark.timeout(240)
# Not shaped like provider keys on purpose: the log redactor must not be what saves us.
DEFAULT_KEY = f"default-endpoint-key-{new_id().lower()}"
PROVIDER_KEY = f"project-provider-key-{new_id().lower()}"


@pytest.fixture(scope="module")
def broker_socket() -> Iterator[Path]:
    # Short: a socket's address holds 107 bytes, and pytest's directories are long.
    where = Path(tempfile.mkdtemp(prefix="szm-", dir="/tmp"))  # noqa: S108
    yield where / "broker.sock"
    shutil.rmtree(where, ignore_errors=True)


@pytest_asyncio.fixture(scope="module")
async def default_model() -> AsyncIterator[ScriptedModelServer]:
    """The platform's default endpoint, as the broker's environment names it."""
    async with ScriptedModelServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module")
async def offline(
    nats_url: str,
    postgres_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    default_model: ScriptedModelServer,
    broker_socket: Path,
) -> AsyncIterator[Stack]:
    env = {
        "SUZUMIO_BROKER_SOCKET": str(broker_socket),
        "SUZUMIO_MODEL_BASE_URL": f"{default_model.url}/v1",
        "SUZUMIO_MODEL_API_KEY": DEFAULT_KEY,
        # The projects' providers here are the scripted server, on this host's loopback.
        "SUZUMIO_RELAY_ALLOW_PRIVATE_PROVIDERS": "true",
    }
    tmp = Path(tmp_path_factory.mktemp("offline"))
    async with running_stack(nats_url, postgres_url, tmp, PLATFORM_SERVICES, env) as stack:
        yield stack


@pytest.fixture
def engine() -> Iterator[Any]:
    api = docker.APIClient(version="auto", timeout=60)
    yield api
    api.close()


async def kept_containers(settings: OrchestratorSettings) -> Backend:
    """Containers stay after they end, for the test to look at (and remove)."""
    return DockerBackend(DockerSettings(cleanup="never"), settings.namespace)


def container_of(engine: Any, activation_id: str) -> dict[str, Any]:
    [found] = engine.containers(
        all=True, filters={"label": f"{LABEL_PREFIX}.activation={activation_id}"}
    )
    info: dict[str, Any] = engine.inspect_container(found["Id"])
    engine.remove_container(found["Id"], force=True)
    return info


def tool_results(requests: list[Any]) -> list[str]:
    return [str(m.get("content")) for r in requests for m in r.messages if m.get("role") == "tool"]


async def kept_or_isolated(settings: OrchestratorSettings) -> Backend:
    """Docker's containers stay after they end, for the test to look at (and remove); the
    process backend isolates with bubblewrap (installed by `tools/docker_engine.py`), the
    socket's directory hidden as the data directory `suzumio up` puts it in is."""
    if BackendName.DOCKER in settings.backends:
        return await kept_containers(settings)
    assert shutil.which("bwrap"), "bubblewrap is missing: `python3 tools/docker_engine.py`"
    assert settings.broker_socket is not None
    hidden = ProcessSettings(hide=(settings.broker_socket.parent,))
    return ProcessBackend(settings.sandboxes(), hidden, data_dir=settings.data_dir)


def probe(port: int, host_socket: Path) -> str:
    """A command telling whether the sandbox reaches the host's loopback (the broker's port:
    an `egress` sandbox here shares the host's network, where it connects) or a socket file
    of the host's in /run (where systemd-resolved's DNS, the user's D-Bus and docker.sock
    are), and which model settings its environment holds."""
    script = (
        "import os, socket\n"
        "held = sorted(k for k in os.environ if k.endswith(('API_KEY', 'BASE_URL')))\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), 2)\n"
        "    print('REACHED-THE-HOST', held)\n"
        "except OSError:\n"
        "    print('NO-WAY-OUT', held)\n"
        "try:\n"
        f"    socket.socket(socket.AF_UNIX).connect('{host_socket}')\n"
        "    print('REACHED-A-HOST-SOCKET')\n"
        "except OSError:\n"
        "    print('NO-HOST-SOCKET')\n"
    )
    return f'python3 -c "{script}"'


@pytest.fixture
def host_socket() -> Iterator[Path]:
    """A socket file of the host's in /run, listening (as a host service's is)."""
    where = Path(tempfile.mkdtemp(prefix="szm-", dir="/run"))
    path = where / "service.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        listening.listen(8)
        yield path
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("backend", ["docker", "process"])
async def test_a_sandbox_without_network_reaches_the_broker_and_its_model_through_the_socket(
    backend: str,
    offline: Stack,
    default_model: ScriptedModelServer,
    broker_socket: Path,
    tmp_path: Path,
    engine: Any,
    host_socket: Path,
) -> None:
    broker_port = int(offline.url_of("toolbroker").rsplit(":", 1)[1])
    async with harness(
        offline,
        default_model,
        tmp_path,
        kept_or_isolated,
        backend,
        broker_socket=broker_socket,
    ) as h:
        world = await h.world("offline", network=NetworkProfile.NONE)
        default_model.script(
            [
                Reply.tool_calls(
                    [ToolCall("shell_exec", {"command": probe(broker_port, host_socket)})]
                ),
                Reply.text("answered without a network"),
            ]
        )
        seen = len(default_model.completion_requests)
        activation_id = await h.request(world)
        story = await h.ended(activation_id, timeout=120)
        info = container_of(engine, activation_id) if backend == "docker" else None
    assert story[-1] == "activation.completed", story
    calls = default_model.completion_requests[seen:]
    assert len(calls) == 2
    # The broker called the endpoint with the platform's key; the sandbox had none to send.
    assert {c.headers["authorization"] for c in calls} == {f"Bearer {DEFAULT_KEY}"}
    [result] = tool_results(calls)
    assert "NO-WAY-OUT []" in result, result
    assert "NO-HOST-SOCKET" in result, result
    async with offline.client(world.key) as c:
        await eventually(
            lambda: c.get(f"/v1/sessions/{world.session_id}/messages"),
            lambda r: "answered without a network" in r.text,
            what="the answer in the session's history",
        )
    if info is None:
        return
    assert info["HostConfig"]["NetworkMode"] == "none"
    env = info["Config"]["Env"]
    assert not [e for e in env if "API_KEY" in e or "BASE_URL" in e], env
    assert DEFAULT_KEY not in str(info)
    [socket_mount] = [m for m in info["Mounts"] if m["Destination"] == "/activation/broker.sock"]
    assert (socket_mount["Source"], socket_mount["RW"]) == (str(broker_socket), False)


async def test_without_bubblewrap_the_process_backend_refuses_a_sandbox_without_network(
    offline: Stack, default_model: ScriptedModelServer, broker_socket: Path, tmp_path: Path
) -> None:
    """Unisolated, the runner would share the host's network: refused, not retried."""

    async def unisolated(settings: OrchestratorSettings) -> Backend:
        return ProcessBackend(settings.sandboxes(), ProcessSettings(isolate=False))

    async with harness(
        offline, default_model, tmp_path, unisolated, "process", broker_socket=broker_socket
    ) as h:
        world = await h.world("plain", network=NetworkProfile.NONE)
        assert "needs bubblewrap" in await h.refused_at_once(world)


async def offline_agent(stack: Stack, world: World, model: ModelSpec) -> None:
    """`world`'s agent on docker without a network, calling `model` (no fallbacks)."""
    commands = CommandClient(stack.nc, stack.topology)
    profile = RuntimeProfileSpec(
        backend=BackendName.DOCKER, image="suzumio-runner:latest", network=NetworkProfile.NONE
    )
    await commands.send(
        SetRuntimeProfile(project_id=world.project_id, name="offline", spec=profile),
        actor="system:test",
    )
    await commands.send(
        UpdateAgent(agent_id=world.agent_id, runtime_profile="offline", model=model),
        actor="system:test",
    )


async def set_provider(stack: Stack, world: World, name: str, base_url: str, key: str) -> None:
    async with stack.client(world.key) as c:
        body = {"base_url": base_url, "model": "primary", "api_key": key}
        ok(await c.put(f"/v1/projects/{world.project_id}/providers/{name}", json=body))


async def test_a_projects_provider_is_called_by_the_broker_with_the_key_the_project_holds(
    offline: Stack,
    default_model: ScriptedModelServer,
    model: ScriptedModelServer,
    broker_socket: Path,
    tmp_path: Path,
    engine: Any,
) -> None:
    world = await new_world(offline, f"prov{new_id()[-5:]}")
    await set_provider(offline, world, "main", f"{model.url}/v1", PROVIDER_KEY)
    await offline_agent(offline, world, ModelSpec(name="primary", provider="main"))
    model.script([Reply.text("the provider answered")])
    async with harness(
        offline, default_model, tmp_path, kept_containers, "docker", broker_socket=broker_socket
    ) as h:
        tokens = tokens_launched(h)
        activation_id = await h.request(world)
        story = await h.ended(activation_id, timeout=120)
        info = container_of(engine, activation_id)
    assert story[-1] == "activation.completed", story
    [call] = model.completion_requests
    assert call.headers["authorization"] == f"Bearer {PROVIDER_KEY}"
    assert call.body["model"] == "primary"
    assert PROVIDER_KEY not in str(info)
    # Nor may the sandbox ask the broker for the key (`/runner/credentials`): its token says
    # it holds none.
    [token] = tokens
    assert TokenSigner([offline.secret_key]).verify(token).keyless


def tokens_launched(h: Any) -> list[str]:
    """The tokens of the sandboxes `h`'s backend launches from now on."""
    tokens: list[str] = []
    launch = h.backend.launch

    async def recorded(plan: Any) -> Any:
        tokens.append(plan.input.token)
        return await launch(plan)

    h.backend.launch = recorded
    return tokens


def on_socket(broker_socket: Path, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(broker_socket)),
        base_url="http://suzumio-broker",
        headers=headers,
        timeout=30,
    )


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_the_relay_answers_an_activation_for_its_agents_models_only(
    offline: Stack, default_model: ScriptedModelServer, broker_socket: Path
) -> None:
    """The relay's refusals, and what it passes on, asked directly on the socket with an
    activation's token (no sandbox: the activation stays requested)."""
    world = await new_world(offline, f"rel{new_id()[-5:]}")  # its agent calls `demo`, no provider
    closed = socket_port_nobody_listens_on()
    await set_provider(offline, world, "gone", f"http://127.0.0.1:{closed}/v1", "k")
    commands = CommandClient(offline.nc, offline.topology)
    await commands.send(
        UpdateAgent(agent_id=world.agent_id, fallbacks=(ModelSpec(name="x", provider="gone"),)),
        actor="system:test",
    )
    activation_id = await request_activation(offline, world)
    token = token_of(offline, world, activation_id)
    default = "/runner/models/default/chat/completions"

    async with on_socket(broker_socket, None) as anonymous:
        refused = await anonymous.post(default, json=chat("demo"))
    assert refused.status_code == 401

    async with on_socket(broker_socket, token) as b:
        # A model the agent does not call, or not through that way: 404, nothing relayed.
        before = len(default_model.completion_requests)
        assert (await b.post(default, json=chat("gpt-elsewhere"))).status_code == 404
        other = "/runner/models/providers/main/chat/completions"
        assert (await b.post(other, json=chat("demo"))).status_code == 404
        assert (await b.post(default, content=b"not json")).status_code == 400
        # Nested past the parser's depth (a RecursionError, not a ValueError): no 500.
        assert (await b.post(default, content=b"[" * 100_000)).status_code == 400
        assert len(default_model.completion_requests) == before

        default_model.script([Reply.text("relayed")])
        answer = await b.post(default, json=chat("demo"))
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert "relayed" in answer.text
        assert default_model.completion_requests[-1].headers["authorization"] == (
            f"Bearer {DEFAULT_KEY}"
        )

        # A provider's refusal comes back as it was — but for the key, which it quoted.
        quoted = error_body(f"Incorrect API key provided: {DEFAULT_KEY}", type_="invalid_request")
        default_model.script([Reply.error(401, quoted, headers={"retry-after": "7"})])
        answer = await b.post(default, json=chat("demo"))
        assert (answer.status_code, answer.headers["retry-after"]) == (401, "7")
        assert DEFAULT_KEY not in answer.text
        assert "Incorrect API key provided: ***" in answer.text

        # An endpoint nobody answers on: 502, which the runner retries.
        unreachable = await b.post("/runner/models/providers/gone/chat/completions", json=chat("x"))
        assert unreachable.status_code == 502
        assert unreachable.json()["code"] == "model_unreachable"


def socket_port_nobody_listens_on() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_without_the_brokers_socket_an_offline_activation_fails_at_once(
    offline: Stack, default_model: ScriptedModelServer, tmp_path: Path
) -> None:
    """An orchestrator not told where the broker's socket is cannot give the sandbox a way
    out: the activation fails, not retried, with the variable to set; nothing is launched."""
    async with harness(offline, default_model, tmp_path, kept_containers, "docker") as h:
        world = await h.world("nosock", network=NetworkProfile.NONE)
        assert "SUZUMIO_BROKER_SOCKET" in await h.refused_at_once(world)
