"""`web.fetch` refuses private, local and link-local addresses before connecting, pins the
address it checked (DNS rebinding), re-checks every redirect and caps what it reads.

Network rule of these tests: nothing but 127.0.0.1 is ever contacted. Refusals are asserted
with `httpx.AsyncClient.send` replaced by a tripwire, so a refusal that came too late fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.addresses import refused_reason
from suzumio.runner.tools.base import ToolContext, ToolLimits
from suzumio.runner.tools.web import IPAddress, WebFetch, html_to_text
from tests.support import make_certificate

LOOPBACK = (ipaddress.IPv4Network("127.0.0.1/32"),)

Route = tuple[int, dict[str, str], bytes]


@dataclass
class Server:
    port: int
    routes: dict[str, Callable[[dict[str, str]], Route]] = field(default_factory=dict)
    hosts_seen: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str = "/", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


async def _serve(
    server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *lines = head.split("\r\n")
        headers = {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines if ln)}
        server.hosts_seen.append(headers.get("host", ""))
        path = request_line.split()[1]
        if path == "/hang":
            await server.release.wait()
            return
        status, extra, body = server.routes[path](headers)
        fields = {"Content-Length": str(len(body)), "Connection": "close", **extra}
        writer.write(f"HTTP/1.1 {status} X\r\n".encode())
        writer.write("".join(f"{k}: {v}\r\n" for k, v in fields.items()).encode() + b"\r\n")
        writer.write(body)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass  # the client hung up early: the size cap at work
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def local_server(tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    box: list[Server] = []
    listener = await asyncio.start_server(
        lambda r, w: _serve(box[0], r, w), "127.0.0.1", 0, ssl=tls
    )
    server = Server(port=listener.sockets[0].getsockname()[1])
    box.append(server)
    try:
        yield server
    finally:
        server.release.set()
        listener.close()
        await listener.wait_closed()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with local_server() as running:
        yield running


@pytest.fixture
def tripwire(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Any request that reaches the network layer is recorded and fails the call."""
    attempts: list[str] = []

    async def refuse(self: httpx.AsyncClient, request: httpx.Request, **_: Any) -> httpx.Response:
        attempts.append(str(request.url))
        raise AssertionError(f"connection attempted to {request.url}")

    monkeypatch.setattr(httpx.AsyncClient, "send", refuse)
    return attempts


def ctx(*, allow_private: bool = False, **limits: Any) -> ToolContext:
    return ToolContext(
        workspace=Path("/nonexistent"),
        limits=ToolLimits(**limits),
        allow_private_network=allow_private,
    )


def text_route(body: str, content_type: str = "text/plain; charset=utf-8") -> Callable[..., Route]:
    return lambda _headers: (200, {"Content-Type": content_type}, body.encode())


def redirect_route(location: str) -> Callable[..., Route]:
    return lambda _headers: (302, {"Location": location}, b"")


def fixed_resolver(table: dict[str, list[str]]) -> Callable[[str, int], Awaitable[list[IPAddress]]]:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in table[host]]

    return resolve


# --- the address policy --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "non-global"),
        ("240.0.0.1", "private"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback (embedded in ::ffff:7f00:1)"),
        ("::ffff:169.254.169.254", "link-local (embedded in ::ffff:a9fe:a9fe)"),
        ("2002:a00:1::", "private (embedded in 2002:a00:1::)"),
        ("64:ff9b::a00:1", "private (embedded in 64:ff9b::a00:1)"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("::ffff:8.8.8.8", None),
    ],
)
def test_address_policy(address: str, reason: str | None) -> None:
    assert refused_reason(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://192.168.1.1/",
        "http://127.0.0.1:9/",
        "http://[::ffff:10.0.0.1]/",
        "http://localhost/",
        "http://2130706433/",
    ],
)
async def test_private_targets_are_refused_before_any_connection(
    url: str, tripwire: list[str]
) -> None:
    result = await WebFetch().run({"url": url}, ctx())
    assert result.status == "error"
    assert result.text.startswith("refused: ")
    assert tripwire == []


async def test_any_private_answer_among_public_ones_is_refused(tripwire: list[str]) -> None:
    tool = WebFetch(resolver=fixed_resolver({"mixed.test": ["93.184.216.34", "10.1.2.3"]}))
    result = await tool.run({"url": "https://mixed.test/"}, ctx())
    assert "10.1.2.3, a private address" in result.text
    assert tripwire == []


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://127.0.0.1/", "gopher://x/", "http://user:pw@127.0.0.1/", "nope"],
)
async def test_other_schemes_and_credentials_are_refused(url: str, tripwire: list[str]) -> None:
    result = await WebFetch().run({"url": url}, ctx(allow_private=True))
    assert result.status == "error"
    assert tripwire == []


# --- fetching from 127.0.0.1 ---------------------------------------------------------------


async def test_fetch_returns_status_type_and_text(server: Server) -> None:
    server.routes["/a"] = text_route("héllo wörld")
    result = await WebFetch().run({"url": server.url("/a")}, ctx(allow_private=True))
    assert result.status == "ok"
    assert result.text == "HTTP 200 X\nContent-Type: text/plain; charset=utf-8\n\nhéllo wörld"


async def test_html_becomes_readable_text(server: Server) -> None:
    page = (
        "<html><head><title>Docs</title><style>p{}</style><script>alert(1)</script></head>"
        "<body><h1>Intro</h1><p>Read the <a href='/guide'>guide</a>&nbsp;now.</p></body></html>"
    )
    server.routes["/page"] = text_route(page, "text/html")
    result = await WebFetch().run({"url": server.url("/page")}, ctx(allow_private=True))
    assert result.text.endswith(
        "(HTML converted to text)\n\nDocs\n\nIntro\n\nRead the guide (/guide) now."
    )
    assert "alert" not in result.text


async def test_binary_bodies_are_not_shown(server: Server) -> None:
    server.routes["/img"] = lambda _h: (200, {"Content-Type": "image/png"}, b"\x89PNG\x00" * 10)
    result = await WebFetch().run({"url": server.url("/img")}, ctx(allow_private=True))
    assert result.text.endswith("[binary body: 50 bytes read, not shown]")


async def test_body_is_capped(server: Server) -> None:
    server.routes["/big"] = text_route("x" * 1_000_000)
    tool = WebFetch()
    small = await tool.run({"url": server.url("/big"), "max_bytes": 1000}, ctx(allow_private=True))
    body = small.text.split("\n\n", 1)[1]
    assert body == "x" * 1000 + "\n[truncated at 1000 bytes]"
    # The runner's limit wins over a larger request.
    limited = ctx(allow_private=True, fetch_max_bytes=500)
    capped = await tool.run({"url": server.url("/big"), "max_bytes": 10**9}, limited)
    assert capped.text.endswith("x" * 500 + "\n[truncated at 500 bytes]")


def _deflated(data: bytes, wbits: int, times: int = 1) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return b"".join([*(packer.compress(data) for _ in range(times)), packer.flush()])


@pytest.mark.parametrize(
    ("coding", "wbits"),
    [("gzip", 31), ("x-gzip", 31), ("deflate", 15), ("deflate", -15), ("identity", 0)],
    ids=["gzip", "x-gzip", "deflate-zlib", "deflate-raw", "identity"],
)
async def test_compressed_bodies_are_decoded(server: Server, coding: str, wbits: int) -> None:
    text = "compressed pages are common\n" * 100
    body = _deflated(text.encode(), wbits) if wbits else text.encode()
    server.routes["/z"] = lambda _h: (
        200,
        {"Content-Type": "text/plain", "Content-Encoding": coding},
        body,
    )
    result = await WebFetch().run({"url": server.url("/z")}, ctx(allow_private=True))
    assert result.status == "ok", result.text
    assert result.text.split("\n\n", 1)[1] == text
    # And the decoded body is what max_bytes counts.
    cut = await WebFetch().run({"url": server.url("/z"), "max_bytes": 10}, ctx(allow_private=True))
    assert cut.text.endswith("\n\ncompressed\n[truncated at 10 bytes]")


async def test_a_compression_bomb_costs_no_more_than_the_cap(server: Server) -> None:
    """128 MiB of zeros in 128 KiB of gzip: before, httpx inflated each whole network chunk
    (64 MiB) before the cap applied."""
    bomb = _deflated(b"a" * (1 << 20), 31, times=128)
    server.routes["/bomb"] = lambda _h: (
        200,
        {"Content-Type": "text/plain", "Content-Encoding": "gzip"},
        bomb,
    )
    tracemalloc.start()
    try:
        result = await WebFetch().run(
            {"url": server.url("/bomb"), "max_bytes": 1000}, ctx(allow_private=True)
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.text.endswith("a" * 1000 + "\n[truncated at 1000 bytes]")
    assert peak < 16 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("coding", ["gzip, gzip", "br", "zstd", "compress"])
async def test_stacked_and_unknown_encodings_are_refused(server: Server, coding: str) -> None:
    """Stacked gzip multiplies a bomb's ratio; what we cannot inflate in bounded steps we do
    not inflate at all."""
    body = _deflated(_deflated(b"x" * 10_000, 31), 31)
    server.routes["/z"] = lambda _h: (
        200,
        {"Content-Type": "text/plain", "Content-Encoding": coding},
        body,
    )
    result = await WebFetch().run({"url": server.url("/z")}, ctx(allow_private=True))
    assert result.status == "error"
    assert f"Content-Encoding {coding!r}" in result.text
    assert "one gzip or deflate layer" in result.text


async def test_corrupt_compressed_data_is_an_error(server: Server) -> None:
    server.routes["/z"] = lambda _h: (200, {"Content-Encoding": "gzip"}, b"not gzip at all")
    result = await WebFetch().run({"url": server.url("/z")}, ctx(allow_private=True))
    assert result.status == "error"
    assert "not valid compressed data" in result.text


async def test_redirects_are_followed_and_reported(server: Server) -> None:
    server.routes["/old"] = redirect_route("/new")
    server.routes["/new"] = text_route("moved here")
    result = await WebFetch().run({"url": server.url("/old")}, ctx(allow_private=True))
    assert result.text.startswith(f"HTTP 200 X\nURL: {server.url('/new')} (redirected)\n")
    assert result.text.endswith("moved here")


async def test_redirect_to_a_private_address_is_refused(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 127.0.0.1 plays the public site (an operator-allowed network); its redirect points at
    # the cloud metadata service, which must be refused without a connection.
    contacted: list[str] = []
    real_send = httpx.AsyncClient.send

    async def spy(self: httpx.AsyncClient, request: httpx.Request, **kw: Any) -> httpx.Response:
        contacted.append(request.url.host)
        assert request.url.host == "127.0.0.1"
        return await real_send(self, request, **kw)

    monkeypatch.setattr(httpx.AsyncClient, "send", spy)
    server.routes["/r"] = redirect_route("http://169.254.169.254/latest/meta-data/")
    server.routes["/r6"] = redirect_route("http://[fd00::1]/")
    tool = WebFetch(allowed_networks=LOOPBACK)
    for path, refused in (("/r", "169.254.169.254, a link-local"), ("/r6", "fd00::1, a private")):
        result = await tool.run({"url": server.url(path)}, ctx())
        assert result.status == "error"
        assert refused in result.text
    assert contacted == ["127.0.0.1", "127.0.0.1"]


async def test_redirect_to_another_scheme_is_refused(server: Server) -> None:
    server.routes["/f"] = redirect_route("file:///etc/passwd")
    result = await WebFetch().run({"url": server.url("/f")}, ctx(allow_private=True))
    assert result.status == "error"
    assert "only http and https" in result.text


async def test_redirect_loops_stop_at_the_limit(server: Server) -> None:
    server.routes["/loop"] = redirect_route("/loop")
    result = await WebFetch().run(
        {"url": server.url("/loop")}, ctx(allow_private=True, fetch_max_redirects=2)
    )
    assert result.status == "error"
    assert result.text.startswith("more than 2 redirects")
    assert len(server.hosts_seen) == 3


async def test_the_checked_address_is_pinned_and_the_host_kept(server: Server) -> None:
    # `pinned.test` does not exist in DNS: the fetch can only succeed by connecting to the
    # address the resolver gave at check time, sending the name in the Host header.
    server.routes["/who"] = lambda headers: (200, {}, headers["host"].encode())
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[IPAddress]:
        calls.append(host)
        return [ipaddress.ip_address("127.0.0.1")]

    tool = WebFetch(resolver=resolver, allowed_networks=LOOPBACK)
    result = await tool.run({"url": server.url("/who", host="pinned.test")}, ctx())
    assert result.status == "ok", result.text
    assert result.text.endswith(f"pinned.test:{server.port}")
    assert calls == ["pinned.test"]


async def test_localhost_by_name_when_private_is_allowed(server: Server) -> None:
    server.routes["/"] = text_route("local")
    result = await WebFetch().run({"url": server.url(host="localhost")}, ctx(allow_private=True))
    assert result.status == "ok", result.text
    assert server.hosts_seen == [f"localhost:{server.port}"]


async def test_a_silent_server_times_out(server: Server) -> None:
    result = await WebFetch().run(
        {"url": server.url("/hang")}, ctx(allow_private=True, fetch_timeout_seconds=0.3)
    )
    assert result.status == "timeout"
    assert "timed out after 0.3s" in result.text


async def test_a_closed_port_is_a_clear_error(server: Server) -> None:
    result = await WebFetch().run({"url": "http://127.0.0.1:1/"}, ctx(allow_private=True))
    assert result.status == "error"
    assert result.text.startswith("fetching http://127.0.0.1:1/ failed")


# --- https pinning -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return {
        name: make_certificate(tmp_path_factory.mktemp(name), name)
        for name in ("pinned.test", "other.test")
    }


@pytest.mark.parametrize(("served", "ok"), [("pinned.test", True), ("other.test", False)])
async def test_https_connects_to_the_pinned_ip_but_verifies_the_name(
    certificates: dict[str, tuple[Path, Path]], served: str, ok: bool
) -> None:
    cert, key = certificates[served]
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    trust = ssl.create_default_context(cafile=str(cert))
    tool = WebFetch(
        resolver=fixed_resolver({"pinned.test": ["127.0.0.1"]}),
        allowed_networks=LOOPBACK,
        verify=trust,
    )
    async with local_server(tls) as running:
        running.routes["/"] = text_route("over tls")
        url = running.url(host="pinned.test", scheme="https")
        result = await tool.run({"url": url}, ctx())
    if ok:
        assert result.status == "ok", result.text
        assert result.text.endswith("over tls")
    else:
        # A certificate for another name fails, so the name (not the IP) was verified.
        assert result.status == "error"
        assert "certificate" in result.text.lower()


def test_html_to_text_keeps_structure_and_links() -> None:
    html = "<ul><li>one</li><li><a href='https://x.test/2'>two</a></li></ul><a href='#top'>up</a>"
    assert html_to_text(html) == "one\n\ntwo (https://x.test/2)\n\nup"
