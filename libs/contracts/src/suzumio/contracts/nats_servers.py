"""How a NATS URL setting (`SUZUMIO_NATS_URL`, a worker's `--nats`) becomes nats-py's server
list and credentials, for every client of the bus alike.

The setting may list several servers, comma-separated (`nats://TOKEN@a:4222,nats://b:4222`).
Credentials in a URL go to nats-py as the connection's own (`token`, or `user` and
`password`), not only as that URL's: a client learns a cluster's other nodes from the node it
reached (their addresses without credentials) and moves to one of them when its node goes —
with the credentials only in the URL, every such move was refused ("authentication error")
and the client stayed away for good once its node did not come back.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit


def nats_servers(setting: str) -> tuple[list[str], dict[str, str]]:
    """The servers `setting` lists, and the credentials the first that has any carries
    (nats-py's `token`, or `user` and `password`: {} when none has)."""
    servers = [s.strip() for s in setting.split(",") if s.strip()]
    for server in servers:
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        if parts.username is None:
            continue
        if parts.password is None:
            return servers, {"token": unquote(parts.username)}
        return servers, {"user": unquote(parts.username), "password": unquote(parts.password)}
    return servers, {}
