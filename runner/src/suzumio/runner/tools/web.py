"""`web.fetch`: GET a public http(s) URL with a size cap, a deadline and no way to reach the
sandbox's private neighbours (DESIGN.md §9, §10).

Before any connection the host is resolved and *every* address checked: loopback, private,
link-local, unspecified, multicast, reserved and other non-global addresses are refused, also
when hidden inside IPv6 (IPv4-mapped, 6to4, NAT64), unless `ctx.allow_private_network` or an
operator-granted network allows them. The request then goes to the checked address itself, so
a second DNS answer cannot swap in another (DNS rebinding): the URL's host is replaced by the
pinned IP while the Host header keeps the name and, for https, the TLS server name (SNI and
certificate check) stays the name through httpx's `sni_hostname` extension. Proxies from the
environment are ignored (a proxy would resolve names itself, past the check).

Redirects are followed by hand, at most `fetch_max_redirects`, each hop checked again. The body
is streamed and cut at `max_bytes` *after* decoding: one gzip or deflate layer is inflated in
bounded steps (a compression bomb costs at most `max_bytes` of memory), stacked or other
content encodings are refused. HTML is reduced to readable text.
"""

from __future__ import annotations

import asyncio
import codecs
import ipaddress
import re
import socket
import ssl
import zlib
from collections.abc import Awaitable, Callable
from html import unescape
from typing import Any

import httpx

from suzumio.contracts.addresses import refused_reason
from suzumio.contracts.runner import ToolDefinition
from suzumio.runner.tools.base import ToolContext, ToolInputError, ToolResult, printable
from suzumio.runner.tools.paths import Reads, check_keys, object_schema, optional_int, required_str

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript")
_HTML_TYPES = ("text/html", "application/xhtml+xml")


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for `host`, in its order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0])
        if address not in found:
            found.append(address)
    return found


class WebFetch(Reads):
    definition = ToolDefinition(
        name="web.fetch",
        description=(
            "Fetch a public http or https URL with GET and return the status, content type and "
            "body as text (HTML is converted to readable text, binary bodies are not shown). "
            "Redirects are followed. Private and local network addresses are refused."
        ),
        parameters=object_schema(
            {
                "url": {"type": "string", "description": "Absolute http:// or https:// URL."},
                "max_bytes": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Read at most this many body bytes (capped by the runner).",
                },
            },
            required=("url",),
        ),
        read_only=True,
    )
    _keys = frozenset({"url", "max_bytes"})

    def __init__(
        self,
        *,
        resolver: Resolver = system_resolver,
        allowed_networks: tuple[IPNetwork, ...] = (),
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """`allowed_networks` are reachable even when private addresses are refused (an
        internal mirror, say); `verify` is httpx's TLS verification (True, or an SSLContext
        holding a private CA)."""
        self._resolve = resolver
        self._allowed = allowed_networks
        self._verify = verify

    def allowed_seconds(self, args: dict[str, Any], ctx: ToolContext) -> float:
        del args
        return ctx.limits.fetch_timeout_seconds

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        limits = ctx.limits
        try:
            check_keys(args, self._keys)
            url = _parse_url(required_str(args, "url"))
            cap = min(
                optional_int(args, "max_bytes") or limits.fetch_max_bytes, limits.fetch_max_bytes
            )
            async with asyncio.timeout(limits.fetch_timeout_seconds):
                return await self._fetch(url, cap, ctx)
        except ToolInputError as exc:
            return ToolResult(str(exc), "error")
        except (TimeoutError, httpx.TimeoutException):
            return ToolResult(
                f"fetching {args.get('url')} timed out after {limits.fetch_timeout_seconds:g}s",
                "timeout",
            )
        except httpx.HTTPError as exc:
            return ToolResult(
                f"fetching {args.get('url')} failed: {exc or type(exc).__name__}", "error"
            )

    async def _fetch(self, url: httpx.URL, cap: int, ctx: ToolContext) -> ToolResult:
        limits = ctx.limits
        async with httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            verify=self._verify,
            timeout=httpx.Timeout(limits.fetch_timeout_seconds),
            # Only what `_read_capped` can inflate in bounded steps.
            headers={"User-Agent": "suzumio-runner/web.fetch", "Accept-Encoding": "gzip, deflate"},
        ) as client:
            current = url
            for _ in range(limits.fetch_max_redirects + 1):
                addresses = await self._checked_addresses(current, ctx)
                response = await _send_pinned(client, current, addresses)
                try:
                    location = response.headers.get("location")
                    if response.status_code in _REDIRECTS and location:
                        current = _redirect_target(current, location)
                        continue
                    body, truncated = await _read_capped(response, cap)
                    return ToolResult(_render(url, current, response, body, truncated))
                finally:
                    await response.aclose()
        raise ToolInputError(
            f"more than {limits.fetch_max_redirects} redirects; the last pointed to {current}"
        )

    async def _checked_addresses(self, url: httpx.URL, ctx: ToolContext) -> list[IPAddress]:
        host = url.host
        try:
            addresses: list[IPAddress] = [ipaddress.ip_address(host)]
        except ValueError:
            port = url.port or (443 if url.scheme == "https" else 80)
            try:
                addresses = await self._resolve(url.raw_host.decode("ascii"), port)
            except OSError as exc:
                raise ToolInputError(f"cannot resolve {host}: {exc.strerror or exc}") from None
        if not addresses:
            raise ToolInputError(f"cannot resolve {host}: no addresses")
        if not ctx.allow_private_network:
            for address in addresses:
                reason = refused_reason(address)
                if reason and not any(address in net for net in self._allowed):
                    raise ToolInputError(
                        f"refused: {host} resolves to {address}, a {reason} address; only "
                        "public internet addresses may be fetched"
                    )
        return addresses


def _redirect_target(current: httpx.URL, location: str) -> httpx.URL:
    try:
        joined = str(current.join(location))
    except httpx.InvalidURL as exc:
        raise ToolInputError(f"redirect to an invalid URL {location!r}: {exc}") from None
    return _parse_url(joined, what="redirect target")


def _parse_url(text: str, *, what: str = "url") -> httpx.URL:
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, UnicodeError) as exc:  # UnicodeError: a lone surrogate (JSON \ud800)
        raise ToolInputError(f"{what} {printable(text)!r} is not a valid URL: {exc}") from None
    if url.scheme not in {"http", "https"}:
        raise ToolInputError(f"{what} {text!r}: only http and https URLs can be fetched")
    if not url.host:
        raise ToolInputError(f"{what} {text!r} has no host")
    if url.userinfo:
        raise ToolInputError(f"{what} {text!r}: credentials in URLs are not supported")
    return url.copy_with(fragment=None)


async def _send_pinned(
    client: httpx.AsyncClient, url: httpx.URL, addresses: list[IPAddress]
) -> httpx.Response:
    """Connect to the checked addresses in order (the next one when a connection fails),
    never to whatever the name resolves to now."""
    failure: httpx.ConnectError | None = None
    for address in addresses:
        extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
        request = client.build_request(
            "GET",
            url.copy_with(host=str(address)),
            headers={"Host": url.netloc.decode("ascii")},
            extensions=extensions,
        )
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError as exc:
            failure = exc
    assert failure is not None
    raise failure


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """The body decoded, cut at `cap` bytes, and whether it was cut.

    The raw stream is decoded here rather than by httpx: httpx inflates each whole network
    chunk (and every stacked encoding) before a cap could apply, so a kilobyte of gzip can
    become gigabytes in memory. Here no step yields more than `_STEP` bytes, and decoding stops
    at the cap."""
    decoder = _decoder(response.headers.get("content-encoding", ""))
    body = bytearray()
    async for chunk in response.aiter_raw():
        if decoder is None:
            body += chunk[: cap + 1 - len(body)]
        else:
            decoder.feed(chunk, body, cap + 1)
        if len(body) > cap:
            return bytes(body[:cap]), True
        if decoder is not None and decoder.done:
            break
    return bytes(body), False


_STEP = 64 * 1024  # decoded bytes per step: each step is short work on the event loop
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class _Inflater:
    """One gzip or deflate layer, inflated in bounded steps."""

    def __init__(self, wbits: int) -> None:
        self._raw_fallback = wbits == zlib.MAX_WBITS  # some servers send deflate without zlib
        self._started = False
        self._inflate = zlib.decompressobj(wbits)

    @property
    def done(self) -> bool:
        return self._inflate.eof

    def feed(self, data: bytes, body: bytearray, limit: int) -> None:
        """Inflate `data` into `body` until it holds `limit` bytes or `data` is used up."""
        while len(body) < limit and not self._inflate.eof:
            step = min(_STEP, limit - len(body))
            try:
                out = self._inflate.decompress(data, step)
            except zlib.error as exc:
                if self._raw_fallback and not self._started:
                    self._raw_fallback = False
                    self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise httpx.DecodingError(f"the body is not valid compressed data: {exc}") from None
            self._started = True
            body += out
            data = self._inflate.unconsumed_tail
            # A full step may leave output pending inside zlib even with no input left.
            if not data and len(out) < step:
                return


def _decoder(header: str) -> _Inflater | None:
    """The decoder for a Content-Encoding, or None for an unencoded body. A single gzip or
    deflate layer is decoded; stacked or other encodings are refused rather than decoded
    without bounds (we ask for gzip and deflate only)."""
    codings = [c.strip().lower() for c in header.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _WBITS:
        raise httpx.DecodingError(
            f"the server sent the body with Content-Encoding {header!r}; web.fetch decodes only "
            "one gzip or deflate layer"
        )
    return _Inflater(_WBITS[codings[0]])


def _render(
    asked: httpx.URL, final: httpx.URL, response: httpx.Response, body: bytes, truncated: bool
) -> str:
    content_type = response.headers.get("content-type", "")
    lines = [f"HTTP {response.status_code} {response.reason_phrase}".rstrip()]
    if final != asked:
        lines.append(f"URL: {final} (redirected)")
    lines.append(f"Content-Type: {content_type or 'unknown'}")
    media = content_type.split(";", 1)[0].strip().lower()
    if b"\x00" in body[:8192] or (
        media and not media.startswith(_TEXT_TYPES) and "+xml" not in media and "+json" not in media
    ):
        lines.extend(("", f"[binary body: {len(body)} bytes read, not shown]"))
        return "\n".join(lines)
    text = body.decode(_charset(response), "replace")
    if media in _HTML_TYPES:
        text = html_to_text(text)
        lines.append("(HTML converted to text)")
    lines.extend(("", text))
    if truncated:
        lines.append(f"[truncated at {len(body)} bytes]")
    return "\n".join(lines)


def _charset(response: httpx.Response) -> str:
    name = response.charset_encoding or "utf-8"
    try:
        return codecs.lookup(name).name
    except LookupError:
        return "utf-8"  # an unknown declared charset: UTF-8 with replacement still reads


_HIDDEN = frozenset({"script", "style", "noscript", "template", "svg", "iframe"})
_RAW_TEXT = frozenset({"script", "style"})
"""Elements whose content is not markup: it runs to their end tag, whatever it holds."""
_BLOCKS = frozenset(
    {
        "p",
        "div",
        "br",
        "li",
        "tr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "title",
        "pre",
        "section",
        "article",
        "header",
        "footer",
        "ul",
        "ol",
        "table",
        "blockquote",
        "hr",
    }
)
_MARKUP = re.compile(r"<[a-zA-Z/!?]")
"""Where markup may begin; any other `<` is text."""
_TAG_OPEN = re.compile(r"<(/?)([a-zA-Z][^\s/>]*)")
# The rest of a tag up to its `>`, quoted values included. Possessive: a tag that never ends
# fails in one pass instead of backtracking.
_TAG_REST = re.compile(r"""(?:[^>"']++|"[^"]*+"|'[^']*+')*+>""")
_ATTR = re.compile(r"""([^\s=/>"']+)\s*(?:=\s*("[^"]*"|'[^']*'|[^\s"'=<>`]+))?""")
_RAW_END = {name: re.compile(rf"</{name}(?=[\s/>])", re.IGNORECASE) for name in _RAW_TEXT}


class _HtmlText:
    """Text of an HTML document in one forward pass. Not `html.parser`: it rescans the rest
    of the document at every construct that does not end (`<a <a <a ...`, `<!--x>` repeated),
    so a hostile page of a few hundred kilobytes held the event loop for minutes, and some
    malformed declarations (`<![x>`) made it raise. Here every position is read a bounded
    number of times: a construct that never ends runs to the end of the document, as it does
    in a browser."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._hidden = 0
        self._links: list[str | None] = []

    def feed(self, html: str) -> None:
        pos, size = 0, len(html)
        while pos < size:
            markup = _MARKUP.search(html, pos)
            lt = size if markup is None else markup.start()
            if lt > pos:
                self._data(unescape(html[pos:lt]))
            if lt == size:
                return
            tag = _TAG_OPEN.match(html, lt)
            if tag is None:
                pos = self._other(html, lt)
                continue
            rest = _TAG_REST.match(html, tag.end())
            # An unbalanced quote: the tag ends at the next `>` after all.
            end = rest.end() if rest else html.find(">", tag.end()) + 1
            if end == 0:
                return  # a tag that never ends takes the rest of the document
            name, body = tag.group(2).lower(), html[tag.end() : end - 1]
            pos = end
            if tag.group(1):
                self._end(name)
                continue
            self._start(name, body)
            if body.endswith("/"):
                self._end(name)
            elif name in _RAW_TEXT:
                close = _RAW_END[name].search(html, pos)
                pos = size if close is None else self._past(html, close.end())

    def _other(self, html: str, lt: int) -> int:
        """Past a comment, declaration, processing instruction or bogus end tag at `lt`."""
        for opening, closing in (("<!--", "-->"), ("<![CDATA[", "]]>")):
            if html.startswith(opening, lt):
                end = html.find(closing, lt + len(opening))
                return len(html) if end < 0 else end + len(closing)
        return self._past(html, lt + 2)

    @staticmethod
    def _past(html: str, start: int) -> int:
        end = html.find(">", start)
        return len(html) if end < 0 else end + 1

    def _data(self, text: str) -> None:
        if not self._hidden:
            self.parts.append(text)

    def _start(self, tag: str, body: str) -> None:
        if tag in _HIDDEN:
            self._hidden += tag not in _RAW_TEXT  # raw text is skipped whole, in `feed`
        elif tag in _BLOCKS:
            self.parts.append("\n")
        elif tag == "a":
            self._links.append(_href(body))

    def _end(self, tag: str) -> None:
        if tag in _HIDDEN:
            if tag not in _RAW_TEXT:
                self._hidden = max(0, self._hidden - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")
        elif tag == "a" and self._links:
            href = self._links.pop()
            # Keep where a link goes: the model navigates by fetching it.
            if href and not href.startswith(("#", "javascript:")) and not self._hidden:
                self.parts.append(f" ({href})")


def _href(body: str) -> str | None:
    href = None
    for attr in _ATTR.finditer(body):
        if attr.group(1).lower() == "href":
            value = attr.group(2)
            if value is None:
                href = None
            else:
                href = unescape(value[1:-1] if value[:1] in {'"', "'"} else value)
    return href


def html_to_text(html: str) -> str:
    """Readable text of an HTML page: scripts and styles dropped, blocks on their own lines,
    link targets kept in parentheses, runs of blank lines collapsed."""
    parser = _HtmlText()
    parser.feed(html)
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()
