"""The API key a command sends, and the header that carries it.

A key that an HTTP header cannot carry (non-ASCII, a control character) is refused here with a
line naming where it came from: otherwise httpx fails deep inside the request with a traceback.
"""

from __future__ import annotations

import os
import re

from suzumio.cli.admin import ADMIN_KEY_FILE
from suzumio.cli.failures import fail, load_settings

API_KEY_VARIABLE = "SUZUMIO_API_KEY"
_HEADER_SAFE = re.compile(r"[!-~]+")  # visible ASCII, which every key we issue is


def api_key(given: str | None, *, local: bool) -> tuple[str, str] | None:
    """The key to send and where it came from: `given` (--key), else $SUZUMIO_API_KEY, else,
    for an API on this machine (`local`), the admin key `suzumio up` saved in the data
    directory; None when there is none. The platform's admin key never goes to another
    host's API on its own: `--api` naming one by mistake would hand it over."""
    for key, source in ((given, "--key"), (os.environ.get(API_KEY_VARIABLE), API_KEY_VARIABLE)):
        if key and key.strip():
            return key.strip(), source
    if not local:
        return None
    path = load_settings().data_dir / ADMIN_KEY_FILE
    try:
        saved = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        fail(f"{path} holds no API key (it is not text)", code=2)
    except OSError as exc:
        fail(f"cannot read the API key in {path}: {exc.strerror or exc}", code=2)
    return (saved, str(path)) if saved else None


def authorization(key: str, source: str) -> dict[str, str]:
    """The header that carries `key`; exit 2 when no header can (the key is not shown)."""
    if not _HEADER_SAFE.fullmatch(key):
        fail(f"the API key from {source} is not one: keys are printable ASCII", code=2)
    return {"Authorization": f"Bearer {key}"}
