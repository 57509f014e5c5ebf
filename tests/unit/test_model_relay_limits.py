"""The tool-broker's model relay calls a project's provider from the broker's place in the
network, not the sandbox's: a provider endpoint on a loopback, private or link-local address
(the platform's own servers, a cloud's metadata service) is refused unless the operator allows
it, the call goes to the address that was checked (no DNS rebinding), one sandbox or one
project may not hold the relay's connections from every other, and no call outlives its
activation's token or the operator's longest call. The upstream is the no-op or the scripted
model server (the one allowed fake); names are resolved by a table here (addresses are
literals: no traffic leaves this host)."""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import json
import ssl
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fastapi.responses import Response, StreamingResponse

from suzumio.contracts.addresses import IPAddress
from suzumio.platform.embedded.process import free_port
from suzumio.platform.service.stream_cut import StreamCutError
from suzumio.testing.model_server import NoopModelServer, Reply, ScriptedModelServer
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.model_relay import (
    FENCE_CHECK_SECONDS,
    LOOKUPS_PER_PROJECT,
    MAX_CALLS_PER_ACTIVATION,
    MAX_ERROR_BYTES,
    STALLED_GRACE_SECONDS,
    ModelRelay,
    Resolver,
    Upstream,
    _asked_model,
    relay_default,
)
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.redaction import redacted
from suzumio.toolbroker.registry import LiveActivation
from tests.support import make_certificate

BODY = b'{"model": "m", "stream": true, "messages": []}'


@pytest.mark.parametrize(
    ("url", "status", "said"),
    [
        ("http://127.0.0.1:4222/v1", 403, "loopback"),
        ("http://10.0.0.7/v1", 403, "private"),
        ("http://169.254.169.254/latest/meta-data", 403, "link-local"),
        ("http://[::ffff:192.168.1.1]/v1", 403, "private"),
        ("http://0.0.0.0:8080/v1", 403, "unspecified"),
        ("https://93.184.216.34/v1?x=", 403, "query"),
        ("https://93.184.216.34/v1#x", 403, "query"),
    ],
)
async def test_a_provider_on_a_private_address_is_not_called(
    url: str, status: int, said: str
) -> None:
    relay = ModelRelay(None, 10)
    with pytest.raises(BrokerError) as refused:
        await relay.check_provider(url, "internal")
    assert refused.value.status == status
    assert said in refused.value.detail
    assert "'internal'" in refused.value.detail


async def test_a_public_provider_is_called_and_the_operator_may_allow_private_ones() -> None:
    await ModelRelay(None, 10).check_provider("https://93.184.216.34/v1", "public")
    allowed = ModelRelay(None, 10, allow_private=True)
    await allowed.check_provider("http://127.0.0.1:11434/v1", "ollama-here")
    with pytest.raises(BrokerError):  # a query never: the relay's path would land in it
        await allowed.check_provider("http://127.0.0.1:11434/v1?to=elsewhere", "ollama-here")


def caller(activation_id: str, project_id: str = "p", expires_in: float = 3600) -> Caller:
    claims = SimpleNamespace(
        activation_id=activation_id,
        project_id=project_id,
        expires_at=datetime.now(UTC) + timedelta(seconds=expires_in),
    )
    activation = LiveActivation(activation_id, "s", "g", project_id)
    return cast("Caller", SimpleNamespace(claims=claims, activation=activation))


async def read(answer: Response) -> bytes:
    assert isinstance(answer, StreamingResponse)
    chunks = [chunk async for chunk in answer.body_iterator]
    return b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)


async def test_one_activation_may_hold_only_a_few_relayed_calls_open() -> None:
    relay = ModelRelay(None, 10)
    async with NoopModelServer() as model:
        upstream = Upstream(f"{model.url}/v1", None)

        async def call(activation_id: str) -> Response:
            return await relay.forward(upstream, BODY, caller(activation_id), "default")

        held = [await call("greedy") for _ in range(MAX_CALLS_PER_ACTIVATION)]
        with pytest.raises(BrokerError) as refused:
            await call("greedy")
        assert (refused.value.status, refused.value.headers) == (429, {"Retry-After": "1"})
        # Another activation's calls go on; and a call read to its end frees its place.
        assert b"data:" in await read(await call("other"))
        assert b"data:" in await read(held[0])
        for answer in (await call("greedy"), *held[1:]):
            assert b"data:" in await read(answer)
    assert model.calls == MAX_CALLS_PER_ACTIVATION + 2


def resolving(table: dict[str, list[str]], asked: list[str]) -> Resolver:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        asked.append(host)
        return [ipaddress.ip_address(a) for a in table[host]]

    return resolve


async def test_a_name_is_checked_by_what_it_resolves_to() -> None:
    asked: list[str] = []
    relay = ModelRelay(
        None,
        10,
        resolver=resolving(
            {"api.test": ["93.184.216.34"], "meta.test": ["169.254.169.254"]}, asked
        ),
    )
    assert await relay.check_provider("https://api.test/v1", "p") == (
        ipaddress.ip_address("93.184.216.34"),
    )
    with pytest.raises(BrokerError) as refused:
        await relay.check_provider("https://meta.test/v1", "p")
    assert (refused.value.status, "link-local" in refused.value.detail) == (403, True)
    assert asked == ["api.test", "meta.test"]


async def test_a_projects_unanswered_lookups_hold_no_other_projects_calls() -> None:
    """A project's provider on a name server that never answers: its lookups hold their
    threads until the resolver gives up, and they took all of the pool's, every project's
    calls waiting behind them. A project has two running at most; past them it is told to
    come back (503), and the others' names resolve meanwhile."""
    answer = asyncio.Event()
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[IPAddress]:
        asked.append(host)
        if host == "silent.test":
            await answer.wait()  # a thread in getaddrinfo, for as long as it takes
        return [ipaddress.ip_address("93.184.216.34")]

    relay = ModelRelay(None, 10, resolver=resolve)
    hanging = [
        asyncio.create_task(relay.check_provider("https://silent.test/v1", "p", "slow"))
        for _ in range(LOOKUPS_PER_PROJECT)
    ]
    while len(asked) < LOOKUPS_PER_PROJECT:  # both lookups under way
        await asyncio.sleep(0)
    with pytest.raises(BrokerError) as refused:
        await relay.check_provider("https://silent.test/v1", "p", "slow")
    assert (refused.value.status, refused.value.headers) == (503, {"Retry-After": "5"})
    assert asked == ["silent.test"] * LOOKUPS_PER_PROJECT  # no third lookup was started
    assert await relay.check_provider("https://api.test/v1", "p", "other")  # not held up

    # A call that gave up waiting leaves its lookup running: its share stays taken until
    # the lookup ends.
    hanging[0].cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    with pytest.raises(BrokerError):
        await relay.check_provider("https://silent.test/v1", "p", "slow")
    answer.set()
    await asyncio.gather(hanging[1])
    for _ in range(5):
        await asyncio.sleep(0)
    assert await relay.check_provider("https://silent.test/v1", "p", "slow")


async def test_the_call_goes_to_the_address_checked_not_a_later_answer() -> None:
    # `pinned.test` is in no DNS: the call reaches the model only by connecting to the address
    # the check resolved (once), with the provider's name in the Host header. A relay that
    # resolved the name again as it connected (DNS rebinding's window) could not reach it.
    asked: list[str] = []
    async with ScriptedModelServer() as model:
        model.script([Reply.text("pinned")])
        port = model.url.rsplit(":", 1)[1]
        relay = ModelRelay(
            None, 10, allow_private=True, resolver=resolving({"pinned.test": ["127.0.0.1"]}, asked)
        )
        upstream = Upstream(f"http://pinned.test:{port}/v1", "k", checked=True)
        assert b"pinned" in await read(await relay.forward(upstream, BODY, caller("a"), "p"))
    assert asked == ["pinned.test"]
    assert model.requests[-1].headers["host"] == f"pinned.test:{port}"


async def test_the_next_address_checked_is_tried_when_one_cannot_be_reached() -> None:
    closed = free_port()
    async with NoopModelServer() as model:
        # Nothing listens on 127.0.0.2 at the model's port (it is bound to 127.0.0.1 only).
        table = {"two.test": ["127.0.0.2", "127.0.0.1"]}
        relay = ModelRelay(None, 10, allow_private=True, resolver=resolving(table, []))
        upstream = Upstream(f"http://two.test:{model.port}/v1", None, checked=True)
        assert b"data:" in await read(await relay.forward(upstream, BODY, caller("a"), "p"))
        # None reachable: 502, as for a provider that is down.
        table["two.test"] = ["127.0.0.1"]
        gone = Upstream(f"http://two.test:{closed}/v1", None, checked=True)
        with pytest.raises(BrokerError) as refused:
            await relay.forward(gone, BODY, caller("a"), "p")
        assert refused.value.status == 502


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return {"api.test": make_certificate(tmp_path_factory.mktemp("api"), "api.test")}


async def test_tls_verifies_the_providers_name_and_no_connection_serves_another_name(
    certificates: dict[str, tuple[Path, Path]],
) -> None:
    """Both names are pinned to the one loopback address and port, where a certificate for
    `api.test` only is served: the call to `api.test` is verified and answered; the call to
    `other.test` must make a connection (and a handshake) of its own, which fails, rather than
    ride the one verified for `api.test` with its own key."""
    cert, key = certificates["api.test"]
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    trust = ssl.create_default_context(cafile=str(cert))
    table = {"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]}
    relay = ModelRelay(None, 10, allow_private=True, resolver=resolving(table, []), verify=trust)
    async with NoopModelServer(tls=tls) as model:
        api = Upstream(f"https://api.test:{model.port}/v1", "key-a", checked=True)
        assert b"data:" in await read(await relay.forward(api, BODY, caller("a"), "p"))
        other = Upstream(f"https://other.test:{model.port}/v1", "key-b", checked=True)
        with pytest.raises(BrokerError) as refused:
            await relay.forward(other, BODY, caller("b"), "p")
        assert refused.value.status == 502
        assert (model.calls, model.connections) == (1, 1)


async def test_one_project_may_hold_only_so_many_relayed_calls_open() -> None:
    relay = ModelRelay(None, 10, max_calls_per_project=2)
    async with NoopModelServer() as model:
        upstream = Upstream(f"{model.url}/v1", None)
        held = [await relay.forward(upstream, BODY, caller(a, "busy"), "p") for a in ("a1", "a2")]
        with pytest.raises(BrokerError) as refused:
            await relay.forward(upstream, BODY, caller("a3", "busy"), "p")
        assert refused.value.status == 429
        assert "SUZUMIO_RELAY_MAX_CALLS_PER_PROJECT" in refused.value.detail
        assert b"data:" in await read(await relay.forward(upstream, BODY, caller("b", "calm"), "p"))
        assert b"data:" in await read(held[0])
        assert b"data:" in await read(
            await relay.forward(upstream, BODY, caller("a3", "busy"), "p")
        )
        assert b"data:" in await read(held[1])


@pytest.mark.parametrize("limit", ["call_seconds", "token"])
async def test_a_provider_that_does_not_answer_in_time_is_a_504(limit: str) -> None:
    relay = ModelRelay(
        None, 10, call_seconds=0.3 if limit == "call_seconds" else 600, max_calls_per_project=1
    )
    who = caller("a", expires_in=0.3 if limit == "token" else 3600)
    async with ScriptedModelServer() as model:
        model.script([Reply.text("late", delay=2.0), Reply.text("next")])
        upstream = Upstream(f"{model.url}/v1", None)
        with pytest.raises(BrokerError) as refused:
            await relay.forward(upstream, BODY, who, "p")
        assert refused.value.status == 504
        # Its place is given back: the project's one call may be made again at once.
        assert b"next" in await read(await relay.forward(upstream, BODY, caller("b"), "p"))


@pytest.mark.parametrize(
    ("key", "quoted"),
    [
        ("sk-a/b+c=", "sk-a/b+c="),
        ("sk-a/b+c=", "sk-a\\/b+c="),
        ("sk-a/b+c=", "sk-a\\u002Fb+c="),
        ("sk-a/b+c=", "sk-a%2Fb%2Bc%3D"),
        ("sk-a/b+c=", "sk-a/b%2bc%3d"),
        ('sk-"q"\\z', 'sk-\\"q\\"\\\\z'),
        ("sk-café", "sk-caf\\u00e9"),
        ("sk-café", "sk-caf%C3%A9"),
        ("ab%41", "ab%41"),
    ],
    ids=[
        "raw",
        "json",
        "json-unicode",
        "url",
        "url-lower",
        "json-quotes",
        "non-ascii",
        "utf8-url",
        "raw-percent",
    ],
)
def test_a_key_is_taken_out_in_any_escaping(key: str, quoted: str) -> None:
    assert redacted(f"bad key {quoted}! again: {quoted}".encode(), key) == (
        b"bad key ***! again: ***"
    )


async def test_an_error_answer_quoting_the_key_has_it_taken_out() -> None:
    key = "sk-a/b+c="
    relay = ModelRelay(None, 10)
    async with ScriptedModelServer() as model:
        model.script([Reply.error(401, "Incorrect API key provided: sk-a\\/b%2Bc=.")])
        answer = await relay.forward(Upstream(f"{model.url}/v1", key), BODY, caller("a"), "p")
    assert answer.status_code == 401
    assert bytes(answer.body) == b"Incorrect API key provided: ***."


def test_redaction_is_linear_in_a_body_and_key_the_provider_and_project_chose() -> None:
    key = "a" * 9_999 + "b"
    body = b"a" * (1 << 20) + b"%61" * 50_000
    started = time.process_time()
    assert redacted(body, key) == body  # not in it
    assert redacted(body + key.encode(), key).endswith(b"***")
    # Quadratic work (a pattern that backtracks) took seconds to minutes here.
    assert time.process_time() - started < 2.0


@pytest.mark.parametrize("runner", ["reads on", "stops reading"])
async def test_a_stream_that_outlasts_the_call_is_cut_and_its_place_given_back(
    runner: str,
) -> None:
    relay = ModelRelay(None, 10, call_seconds=0.5, max_calls_per_project=1)
    async with ScriptedModelServer() as model:
        model.script([Reply.text("one two three four five six", chunk_delay=0.2), Reply.text("x")])
        upstream = Upstream(f"{model.url}/v1", None)
        answer = await relay.forward(upstream, BODY, caller("a"), "p")
        assert isinstance(answer, StreamingResponse)
        chunks = aiter(answer.body_iterator)
        await anext(chunks)
        if runner == "reads on":
            with pytest.raises(StreamCutError):
                async for _ in chunks:
                    pass
        else:  # nothing more is read, as by a runner whose sandbox froze
            await asyncio.sleep(0.5 + STALLED_GRACE_SECONDS + 0.2)
        # Its place is given back: the project's one call may be made again.
        assert b"x" in await read(await relay.forward(upstream, BODY, caller("b"), "p"))
        if runner == "stops reading":
            with pytest.raises(StreamCutError):  # and should it read again, it ends at once
                await anext(chunks)


@pytest.mark.parametrize("provider", ["streaming", "thinking"])
async def test_a_stream_of_an_activation_cancelled_meanwhile_is_cut_and_its_place_given_back(
    provider: str,
) -> None:
    """A cancel (or the activation's end, or a P0 replacing it) fences the activation: what
    its model says from then on counts for nothing, so the relayed stream is cut — also while
    the provider says nothing for a long while — not left to run to the relay's deadline,
    holding the activation's place and the provider's bill."""
    relay = ModelRelay(None, 10, call_seconds=60, max_calls_per_project=1)
    delay = 0.2 if provider == "streaming" else 30.0
    async with ScriptedModelServer() as model:
        model.script(
            [Reply.text("one two three four five six", chunk_delay=delay), Reply.text("x")]
        )
        upstream = Upstream(f"{model.url}/v1", None)
        cancelled = caller("a")
        answer = await relay.forward(upstream, BODY, cancelled, "p")
        assert isinstance(answer, StreamingResponse)
        chunks = aiter(answer.body_iterator)
        await anext(chunks)
        cancelled.activation.fenced = "cancelled"  # as the registry's fold marks it
        started = time.monotonic()
        with pytest.raises(StreamCutError, match="cancelled"):
            async for _ in chunks:
                pass
        # Within a look or two, not at the provider's next word (30 s) or the deadline (60 s).
        assert time.monotonic() - started < 10 * FENCE_CHECK_SECONDS
        # Its place is given back: the project's one call may be made again.
        assert b"x" in await read(await relay.forward(upstream, BODY, caller("b"), "p"))


async def test_a_call_of_an_activation_cancelled_before_its_answer_came_is_refused() -> None:
    """A provider that answers a whole reply at once sends its headers last, after minutes
    of thinking: a cancel meanwhile ends the call within a look or two (403, fenced), not at
    the relay's deadline, and gives its place back."""
    relay = ModelRelay(None, 10, call_seconds=60, max_calls_per_project=1)
    async with ScriptedModelServer() as model:
        model.script([Reply.text("too late", delay=30.0), Reply.text("x")])
        upstream = Upstream(f"{model.url}/v1", None)
        cancelled = caller("a")
        whole = b'{"model": "m", "messages": []}'
        call = asyncio.create_task(relay.forward(upstream, whole, cancelled, "p"))
        await model.wait_for_requests(1)  # the provider has it, and thinks
        await asyncio.sleep(0.1)
        assert not call.done()
        cancelled.activation.fenced = "cancelled"  # as the registry's fold marks it
        started = time.monotonic()
        with pytest.raises(BrokerError) as refused:
            await call
        assert time.monotonic() - started < 3 * FENCE_CHECK_SECONDS
        assert (refused.value.status, refused.value.code) == (403, "fenced")
        assert "cancelled" in refused.value.detail
        # Its place is given back: the project's one call may be made again.
        assert b"x" in await read(await relay.forward(upstream, BODY, caller("b"), "p"))


async def test_a_compressed_error_is_withheld_and_a_compressed_stream_goes_as_it_came() -> None:
    """A provider may compress its answer although the relay asks for none. The key an
    error may quote cannot be taken out of compressed bytes, which the sandbox could open:
    such an error's body is withheld (its status stays). A stream goes on as it came, with its
    content-encoding, for the runner to decode — decoded here, a few compressed bytes could
    grow to gigabytes at once."""
    key = "sk-compressed-0123456789"
    said = json.dumps({"error": {"message": f"invalid key {key}"}}).encode()
    gzip_headers = {"content-encoding": "gzip", "content-type": "application/json"}
    relay = ModelRelay(None, 10)
    async with ScriptedModelServer() as model:
        model.script([Reply.error(401, gzip.compress(said), headers=gzip_headers)])
        answer = await relay.forward(Upstream(f"{model.url}/v1", key), BODY, caller("a"), "p")
    assert answer.status_code == 401
    assert "content-encoding" not in answer.headers
    assert answer.headers["content-type"] == "application/json"
    assert json.loads(bytes(answer.body))["error"]["type"] == "relay_error"

    stream = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
    async with NoopModelServer() as noop:
        noop._streamed = (  # the no-op server's answer, compressed
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
            + f"content-length: {len(gzip.compress(stream))}\r\n\r\n".encode()
            + gzip.compress(stream)
        )
        answer = await relay.forward(Upstream(f"{noop.url}/v1", None), BODY, caller("b"), "p")
        assert answer.headers["content-encoding"] == "gzip"
        assert gzip.decompress(await read(answer)) == stream


async def test_an_error_cut_at_its_bound_amid_a_quote_of_the_key_leaves_none_of_it() -> None:
    """An error answer is read up to 1 MiB: a provider echoing what the sandbox sent, padded
    to place the cut amid the key it quotes, left the key's start at the end of what was
    passed on."""
    key = "sk-straddle-0123456789abcdef"
    padding = "x" * (MAX_ERROR_BYTES - 12)  # the cut falls after the key's first 12 bytes
    relay = ModelRelay(None, 10)
    async with ScriptedModelServer() as model:
        model.script([Reply.error(400, f"{padding}{key} is not valid")])
        answer = await relay.forward(Upstream(f"{model.url}/v1", key), BODY, caller("a"), "p")
    body = bytes(answer.body)
    assert answer.status_code == 400
    assert body.startswith(b"x" * 1000)
    assert key[:6].encode() not in body
    assert redacted(f"bad {key}!".encode(), key, cut=True) == b""  # all of it could be the key
    assert redacted(b"y" * 500 + key[:4].encode(), key, cut=True) == b"y" * (504 - 6 * len(key))


class _Body:
    """A request whose body says when it was read."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.read = False

    async def body(self) -> bytes:
        self.read = True
        return self._body


async def test_a_call_past_the_activations_share_is_refused_before_its_body_is_read() -> None:
    """The body of a call may be tens of megabytes: read and parsed before the share was
    taken, a sandbox's many calls at once took the broker's memory and event loop."""
    relay = ModelRelay(None, 10)
    held = [relay.lease(caller("a1")) for _ in range(MAX_CALLS_PER_ACTIVATION)]
    request = _Body(BODY)
    broker = SimpleNamespace(relay=relay)
    with pytest.raises(BrokerError) as refused:
        await relay_default(cast("Any", request), caller("a1"), cast("Any", broker))
    assert refused.value.status == 429
    assert not request.read
    for release in held:
        release()


@pytest.mark.parametrize(
    ("body", "twice"),
    [
        (b'{"model": "m", "messages": [{"model": "x"}]}', False),  # nested: not the call's
        (b'{"model": "m", "messages": [{"content": "caf\\u00e9"}]}', False),
        (b'{"model": "cheap", "messages": [], "model": "dear"}', True),
        (b'{"model": "cheap", "mod\\u0065l": "dear"}', True),  # the same key, escaped
        (b'[1, "model", "model"]', None),  # no object: names no model (it was a 500)
    ],
)
async def test_a_body_naming_its_model_twice_is_refused(body: bytes, twice: bool | None) -> None:
    """Checked by the last `model` (json keeps it), the body went on as sent: a provider that
    reads the first would be called for a model outside the agent's chain."""
    request = cast("Any", _Body(body))
    if twice is None:
        with pytest.raises(BrokerError) as refused:
            await _asked_model(request)
        assert refused.value.status == 422
        return
    if not twice:
        assert (await _asked_model(request))[1] == "m"
        return
    with pytest.raises(BrokerError) as refused:
        await _asked_model(request)
    assert refused.value.status == 422
