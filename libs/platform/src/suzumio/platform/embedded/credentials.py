"""The embedded servers' secrets: random, made once, in files only their owner can read.

Sandboxes may share the host's network, so a loopback listener is no boundary; what keeps
them out of the event log and the database is a secret they cannot read from the data
directory.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PRIVATE = 0o600
NATS_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, mode 0600 from its first byte (never briefly readable)."""
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.unlink(missing_ok=True)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), PRIVATE)  # whatever the umask
        handle.write(text)
    scratch.replace(path)


def secret_in(path: Path) -> str:
    """The secret kept in `path`, made (URL-safe, 256 random bits) on first use."""
    try:
        secret = path.read_text().strip()
    except FileNotFoundError:
        secret = ""
    if not secret:
        secret = secrets.token_urlsafe(32)
        write_private(path, secret + "\n")
    elif path.stat().st_mode & 0o077:
        path.chmod(PRIVATE)  # a copy restored with looser permissions
    return secret


def redact(url: str) -> str:
    """`url` fit to print: a password, or a token standing alone as the user, becomes ***
    (in each URL of a comma-separated list: a NATS cluster's nodes)."""
    if "," in url:
        return ",".join(redact(one) for one in url.split(","))
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, has_password, _ = userinfo.partition(":")
    if has_password:
        masked = f"{user}:***"
    elif parts.scheme in NATS_SCHEMES:  # nats://TOKEN@host: a lone user is nats-py's token
        masked = "***"
    else:
        return url
    return urlunsplit(parts._replace(netloc=f"{masked}@{host}"))
