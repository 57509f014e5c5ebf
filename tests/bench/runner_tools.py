"""Figures of the runner's built-in tools that run on its event loop, where no timeout can
interrupt them: `web.fetch`'s HTML-to-text conversion of a page at the fetch cap (2 MB), for
an ordinary page and for pages of constructs that never end (`html.parser`, used before, took
49 s for 60 KB of `<a ` and hours at the cap)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from suzumio.runner.tools.web import html_to_text

CAP = 2_000_000
ORDINARY = "<div><p>Some <b>text</b> with <a href='/x?a=1&amp;b=2'>a link</a>.</p></div>\n"
HOSTILE = {
    "unclosed_tags": "<a ",
    "unclosed_comments": "<!--x>",
    "unbalanced_quotes": "<a b='x>",
    "bogus_declarations": "<![x>",
}


def _ms(page: str) -> float:
    started = time.perf_counter()
    html_to_text(page)
    return round((time.perf_counter() - started) * 1000, 1)


async def html_conversion(_nats_url: str, _pg_url: str, _root: Path) -> dict[str, Any]:
    pages = {"ordinary": ORDINARY, **HOSTILE}
    return {
        "page_bytes": CAP,
        "html_to_text_ms": {
            name: _ms(piece * (CAP // len(piece))) for name, piece in pages.items()
        },
    }
