"""A key the provider refuses (401) is refreshed through the tool-broker before the loop falls
back: a user may have replaced the provider's key while the activation ran. The model is the
scripted model server (the one allowed fake), answering by the key each request carries; the
broker is its side of the runner contract as an `httpx.MockTransport` handler
(`tests/unit/loop_support.py`), answering `POST /runner/credentials` as each test needs. The
broker's own rules for that route (who gets which key) are tested on the real service in
tests/e2e/test_credential_refresh.py; its rate limit here, on its pure part."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.broker import CredentialRequest
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import ModelSpec
from suzumio.platform.secrets import SecretBox
from suzumio.runner.agent import AgentLoop, Ending, ModelFailedError
from suzumio.runner.broker import BrokerClient, FencedError
from suzumio.runner.live import LiveStream
from suzumio.runner.log import redacted
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from suzumio.toolbroker.credentials import CredentialDesk
from suzumio.toolbroker.problems import BrokerError
from tests.unit.loop_support import TOKEN, Broker, spec

pytestmark = pytest.mark.timeout(60)
Answer = Callable[[httpx.Request], httpx.Response]


def fresh_key(what: str) -> str:
    """A key of this test alone: the log's redaction set is the process's."""
    return f"sk-{what}-{new_id().lower()}"


class CredentialBroker(Broker):
    """The broker as `loop_support.Broker`, with `POST /runner/credentials` answered by
    `credential` (each request recorded)."""

    def __init__(self, credential: Answer) -> None:
        super().__init__()
        self._credential = credential

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/runner/credentials":
            self.bodies.setdefault(request.url.path, []).append(
                CredentialRequest.model_validate_json(request.content).model_dump()
            )
            return self._credential(request)
        return super().answer(request)

    @property
    def asked(self) -> list[dict[str, Any]]:
        return self.bodies.get("/runner/credentials", [])


def key_answer(key: str) -> Answer:
    return lambda _: httpx.Response(
        200, json={"provider": "main", "api_key": key}, headers={"Cache-Control": "no-store"}
    )


def by_key(server: ScriptedModelServer, accepted: dict[str, list[Reply]]) -> Callable[..., Reply]:
    """Every request answered by the key it carries: 401 (quoting the key, as some providers
    do) unless it is one of `accepted`, whose replies are played in order. The loop sends one
    request at a time, so the last one recorded is the one being answered."""

    def respond(_: dict[str, Any]) -> Reply:
        auth = server.completion_requests[-1].headers.get("authorization", "")
        key = auth.removeprefix("Bearer ")
        if key in accepted and accepted[key]:
            return accepted[key].pop(0)
        return Reply.error(
            401,
            {"error": {"message": f"Incorrect API key provided: {key}", "code": "invalid_api_key"}},
        )

    return respond


@dataclass
class Run:
    server: ScriptedModelServer
    broker: CredentialBroker

    def keys_sent(self, model: str) -> list[str]:
        return [
            r.headers["authorization"].removeprefix("Bearer ")
            for r in self.server.completion_requests
            if r.model == model
        ]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedModelServer]:
    async with ScriptedModelServer() as s:
        yield s


async def run_loop(
    tmp_path: Path,
    server: ScriptedModelServer,
    broker: CredentialBroker,
    chain: list[tuple[ModelSpec, str]],
) -> Ending:
    """The loop over `chain` (each model with the key its environment gave it), to its end."""
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path)
    models = [ModelClient(m, Endpoint(f"{server.url}/v1", key, m.provider)) for m, key in chain]
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    loop = AgentLoop(activation, client, models, toolbox, LiveStream(client), [k for _, k in chain])
    try:
        return await loop.run()
    finally:
        for model in models:
            await model.close()
        await http.aclose()


PRIMARY = ModelSpec(name="primary", provider="main")
BACKUP = ModelSpec(name="backup", provider="spare")


async def test_a_refused_key_is_replaced_by_the_current_one_and_the_same_model_goes_on(
    tmp_path: Path, server: ScriptedModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new, spare = fresh_key("old"), fresh_key("new"), fresh_key("spare")
    (tmp_path / "leak.txt").write_text(f"the key is {new}\n")
    server.default = by_key(
        server,
        {
            new: [
                Reply.tool_calls([ToolCall("file_read", {"path": "leak.txt"})]),
                Reply.text("done with the new key"),
            ],
            spare: [Reply.text("the fallback answered")],
        },
    )
    broker = CredentialBroker(key_answer(new))
    ending = await run_loop(tmp_path, server, broker, [(PRIMARY, old), (BACKUP, spare)])

    assert (ending.reason, ending.text) == ("completed", "done with the new key")
    assert ending.usage["model"] == "primary"  # no fallback
    assert ending.usage["model_calls"] == 2  # the call retried with the new key is not counted
    run = Run(server, broker)
    assert run.keys_sent("primary") == [old, new, new]
    assert run.keys_sent("backup") == []
    # Asked once, naming the endpoint it calls (a key is answered only for that one).
    assert broker.asked == [
        {"model": "primary", "provider": "main", "base_url": f"{server.url}/v1"}
    ]
    # The new key is a secret from the moment it arrived: not in a tool's result (history,
    # the model's next prompt), nor in the log.
    results = broker.tool_results()
    assert len(results) == 1
    assert new not in results[0]["text"]
    assert "[redacted]" in results[0]["text"]
    assert new not in str(server.completion_requests[-1].messages)
    assert new not in capsys.readouterr().err


async def test_every_model_of_the_provider_takes_the_new_key(
    tmp_path: Path, server: ScriptedModelServer
) -> None:
    """A fallback through the same provider calls with the refreshed key at once, instead of
    being refused with the old one (and asking again, inside the broker's rate limit)."""
    old, new = fresh_key("old"), fresh_key("new")
    second = ModelSpec(name="second", provider="main")
    server.script([Reply.forbidden()], model="primary")  # known key, not allowed: fall back
    server.default = by_key(server, {new: [Reply.text("second, with the new key")]})
    broker = CredentialBroker(key_answer(new))
    # primary: 403 → the chain goes on to `second` with the environment's (old) key → 401 →
    # refreshed → `second` with the new key.
    ending = await run_loop(tmp_path, server, broker, [(PRIMARY, old), (second, old)])
    assert ending.text == "second, with the new key"
    run = Run(server, broker)
    assert run.keys_sent("second") == [old, new]
    assert broker.asked == [{"model": "second", "provider": "main", "base_url": f"{server.url}/v1"}]


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("same", id="the same key again"),
        pytest.param(404, id="404 no key to give"),
        pytest.param(429, id="429 not yet"),
        pytest.param("garbled", id="an answer that is no key"),
    ],
)
async def test_no_new_key_falls_back_as_before(
    tmp_path: Path, server: ScriptedModelServer, answer: object
) -> None:
    old, spare = fresh_key("old"), fresh_key("spare")

    def credential(_: httpx.Request) -> httpx.Response:
        if answer == "same":
            return key_answer(old)(_)
        if answer == "garbled":
            return httpx.Response(200, json={"recorded": True})
        assert isinstance(answer, int)
        return httpx.Response(answer, json={"code": "x", "detail": "no"})

    server.default = by_key(server, {spare: [Reply.text("the fallback answered")]})
    broker = CredentialBroker(credential)
    ending = await run_loop(tmp_path, server, broker, [(PRIMARY, old), (BACKUP, spare)])
    assert ending.text == "the fallback answered"
    assert ending.usage["model"] == "backup"
    run = Run(server, broker)
    assert run.keys_sent("primary") == [old]  # never called again with what it refused
    assert len(broker.asked) == 1


async def test_a_new_key_refused_too_is_not_asked_for_in_a_loop(
    tmp_path: Path, server: ScriptedModelServer
) -> None:
    """The new key is refused as well, and the broker keeps answering it: one more question
    for the new key, then the loop stops — the last model fails, its message (which quotes
    the key) redacted as the output will be."""
    old, new = fresh_key("old"), fresh_key("new")
    server.default = by_key(server, {})
    broker = CredentialBroker(key_answer(new))
    with pytest.raises(ModelFailedError) as failed:
        await run_loop(tmp_path, server, broker, [(PRIMARY, old)])
    assert failed.value.failure_class == "auth"
    run = Run(server, broker)
    assert run.keys_sent("primary") == [old, new]
    assert len(broker.asked) == 2
    assert new in str(failed.value)  # the provider quoted it…
    assert new not in redacted(str(failed.value))  # …and the output never will


async def test_a_model_of_the_platforms_endpoint_is_not_refreshed(
    tmp_path: Path, server: ScriptedModelServer
) -> None:
    old, spare = fresh_key("old"), fresh_key("spare")
    server.default = by_key(server, {spare: [Reply.text("the fallback answered")]})
    broker = CredentialBroker(key_answer(fresh_key("never")))
    default = ModelSpec(name="primary")
    ending = await run_loop(tmp_path, server, broker, [(default, old), (BACKUP, spare)])
    assert ending.usage["model"] == "backup"
    assert broker.asked == []


async def test_a_fenced_activation_stops_at_the_question(
    tmp_path: Path, server: ScriptedModelServer
) -> None:
    old, spare = fresh_key("old"), fresh_key("spare")
    server.default = by_key(server, {spare: [Reply.text("the fallback answered")]})
    broker = CredentialBroker(lambda _: httpx.Response(403, json={"code": "fenced"}))
    with pytest.raises(FencedError):
        await run_loop(tmp_path, server, broker, [(PRIMARY, old), (BACKUP, spare)])
    assert Run(server, broker).keys_sent("backup") == []


# -- the broker's rate limit -------------------------------------------------------------------


def test_the_broker_answers_an_activation_once_per_provider_per_interval() -> None:
    desk = CredentialDesk(SecretBox([SecretBox.generate_key()]), interval=10)
    desk.take("act-1", "main", now=100.0)
    with pytest.raises(BrokerError) as limited:
        desk.take("act-1", "main", now=103.0)
    assert limited.value.status == 429
    assert limited.value.headers == {"Retry-After": "7"}
    desk.take("act-1", "spare", now=103.0)  # another provider
    desk.take("act-2", "main", now=103.0)  # another activation
    desk.take("act-1", "main", now=110.0)  # the interval has passed
    with pytest.raises(BrokerError):
        desk.take("act-1", "main", now=119.0)


def test_the_rate_limits_memory_forgets_what_is_past_the_interval() -> None:
    desk = CredentialDesk(SecretBox([SecretBox.generate_key()]), interval=10)
    for i in range(1_000):
        desk.take(f"act-{i}", "main", now=float(i) / 100)  # within 10 s
    desk.take("late", "main", now=1_000.0)
    assert len(desk._last) == 1  # noqa: SLF001 - the bound is the point
