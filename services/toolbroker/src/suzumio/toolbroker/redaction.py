"""A provider key taken out of a provider's error body, however the body escaped it.

A provider that refuses a key may quote it back, as it is or escaped: as a JSON string writes
it (`\\/`, `\\"`, `\\\\`, `\\u00e9`) or URL-encoded (`%2F`, `%2f`). The body is read once with
every such escape decoded, the key searched for in what that reads, and each match replaced
in the body as it was written. Linear in the body (the provider chooses the body and the
project the key: no pattern that could backtrack).
"""

from __future__ import annotations

import bisect
import re

MASK = b"***"
# The most bytes one byte of a key takes, escaped (`\u00e9` for a character of two bytes).
ESCAPED_BYTES_PER_BYTE = 6
_ESCAPE = re.compile(rb'%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\["\\/]')


def redacted(text: bytes, key: str, *, cut: bool = False) -> bytes:
    """`text` with every occurrence of `key`, raw or escaped, replaced by `***`. `cut`:
    `text` is the start of a longer body, which may end amid a quote of the key (the start of
    it would be left: a sandbox padding what the provider echoes could place the cut there):
    as much as the key takes escaped is dropped from its end first."""
    needle = key.encode()
    if not needle:
        return text
    if cut:
        text = text[: max(len(text) - ESCAPED_BYTES_PER_BYTE * len(needle), 0)]
    text = text.replace(needle, MASK)
    decoded, starts, spans = _decode(text)
    cuts: list[tuple[int, int]] = []
    at = decoded.find(needle)
    while at >= 0:
        end = at + len(needle)
        cuts.append(
            (_origin(at, starts, spans, first=True), _origin(end - 1, starts, spans, first=False))
        )
        at = decoded.find(needle, end)
    if not cuts:
        return text
    out = bytearray()
    kept = 0
    for start, end in cuts:
        out += text[kept:start] + MASK
        kept = end
    return bytes(out + text[kept:])


def _decode(text: bytes) -> tuple[bytes, list[int], list[tuple[int, int, bool]]]:
    """The text with its escapes decoded; where each piece of it starts in the decoded text;
    and each piece's span in the text (and whether it is plain text, mapped byte for byte)."""
    pieces: list[bytes] = []
    starts: list[int] = []
    spans: list[tuple[int, int, bool]] = []
    length = 0
    written = 0

    def add(piece: bytes, start: int, end: int, *, plain: bool) -> None:
        nonlocal length
        pieces.append(piece)
        starts.append(length)
        spans.append((start, end, plain))
        length += len(piece)

    for escape in _ESCAPE.finditer(text):
        if escape.start() > written:
            add(text[written : escape.start()], written, escape.start(), plain=True)
        add(_unescape(escape.group()), escape.start(), escape.end(), plain=False)
        written = escape.end()
    add(text[written:], written, len(text), plain=True)
    return b"".join(pieces), starts, spans


def _unescape(escape: bytes) -> bytes:
    if escape.startswith(b"%"):
        return bytes.fromhex(escape[1:].decode())
    if escape.startswith(b"\\u"):
        return chr(int.from_bytes(bytes.fromhex(escape[2:].decode()))).encode(
            "utf-8", "surrogatepass"
        )
    return escape[1:]


def _origin(at: int, starts: list[int], spans: list[tuple[int, int, bool]], *, first: bool) -> int:
    """Where the decoded byte `at` was written: its first offset in the text (`first`), or
    the offset just after it."""
    piece = bisect.bisect_right(starts, at) - 1
    start, end, plain = spans[piece]
    if plain:
        offset = start + at - starts[piece]
        return offset if first else offset + 1
    return start if first else end
