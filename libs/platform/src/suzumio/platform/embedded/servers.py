"""The embedded servers of one data directory, shared by every process that uses it.

`suzumio up` owns them; a service started alone with no URLs configured borrows the ones
already running in the data directory, or starts its own. A lock file serialises the check.
`embedded.json` records who runs what; its entries are cleared on a clean stop and, since a
SIGKILL leaves them behind and pids get reused, a NATS entry is trusted only when that pid is
the nats-server of this data directory and its port answers. It records the URLs without
their secrets (and is the owner's alone anyway): a borrower reads the token and the password
from the servers' own directories, as the servers' owner.
"""

from __future__ import annotations

import fcntl
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from suzumio.platform.embedded import nats
from suzumio.platform.embedded.credentials import redact, write_private
from suzumio.platform.embedded.nats import start_nats
from suzumio.platform.embedded.postgres import start_postgres
from suzumio.platform.embedded.process import RunningServer, pid_alive
from suzumio.platform.errors import EmbeddedServerError


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class EmbeddedServers:
    """NATS and Postgres under `data_dir` (`nats/`, `postgres/`)."""

    data_dir: Path
    durable: bool = True
    nats_sync_interval: str = nats.SYNC_INTERVAL
    nats: RunningServer | None = None
    postgres: RunningServer | None = None
    _started: list[RunningServer] = field(default_factory=list)

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "embedded.json"

    def ensure(self, *, need_nats: bool = True, need_postgres: bool = True) -> EmbeddedServers:
        """Borrow or start what is needed. Call from the main thread (see `child_setup`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with _locked(self.data_dir / "embedded.lock"):
            state = self._read_state()
            try:
                if need_nats:
                    self.nats = self._borrow_nats(state.get("nats")) or self._own(
                        # No monitoring listener: nothing here reads it, and it answers anyone.
                        start_nats(
                            self.data_dir / "nats",
                            monitoring=False,
                            sync_interval=self.nats_sync_interval,
                        )
                    )
                    state["nats"] = {"url": redact(self.nats.url), "pid": self.nats.pid}
                if need_postgres:
                    self.postgres = self._own(
                        start_postgres(self.data_dir / "postgres", durable=self.durable)
                    )
                    state["postgres"] = {
                        "url": redact(self.postgres.url),
                        "pid": self.postgres.pid,
                    }
                write_private(self._state_file, json.dumps(state, indent=2))
            except BaseException:
                # Half a pair serves nobody: what this call started stops with its failure
                # (not through `stop`, whose lock this very call holds).
                for server in self._started:
                    server.stop()
                self._started.clear()
                raise
        return self

    def gone(self) -> list[RunningServer]:
        """The servers in use whose process has ended (killed, crashed, stopped by someone)."""
        return [s for s in (self.nats, self.postgres) if s is not None and not s.alive()]

    def restart(self, server: RunningServer) -> RunningServer:
        """Start `server` (one that is gone) again on its port, so that the URL everyone was
        given stays right and their clients reconnect by themselves. Call from the main
        thread (see `child_setup`). Raises EmbeddedServerError (or OSError) when it cannot."""
        port = urlsplit(server.url).port
        with _locked(self.data_dir / "embedded.lock"):
            if server is self.nats:
                again = start_nats(
                    self.data_dir / "nats",
                    port=port or -1,
                    monitoring=False,
                    sync_interval=self.nats_sync_interval,
                )
            elif server is self.postgres:
                again = start_postgres(self.data_dir / "postgres", port=port, durable=self.durable)
            else:
                raise ValueError(f"{server.name} is not one of these servers")
            if again.url != server.url:  # its secret changed, or another server holds the port
                again.stop()
                raise EmbeddedServerError(
                    f"the {server.name} server came back at another address than"
                    f" {redact(server.url)}"
                )
            self._started = [s for s in self._started if s is not server]
            self._own(again)
            if server is self.nats:
                self.nats = again
            else:
                self.postgres = again
            state = self._read_state()
            state[server.name] = {"url": redact(again.url), "pid": again.pid}
            write_private(self._state_file, json.dumps(state, indent=2))
        return again

    def _read_state(self) -> dict[str, dict[str, object]]:
        try:
            loaded = json.loads(self._state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def _borrow_nats(self, entry: dict[str, object] | None) -> RunningServer | None:
        if not entry:
            return None
        pid, url = entry.get("pid"), entry.get("url")
        if not (isinstance(pid, int) and isinstance(url, str) and pid_alive(pid)):
            return None
        store_dir = (self.data_dir / "nats").resolve()
        conf = str(store_dir / nats.CONFIG_FILE)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return None
        if conf not in argv or not _nats_answers(url):
            return None
        return RunningServer(name="nats", url=nats.with_token(url, nats.token(store_dir)), pid=pid)

    def _own(self, server: RunningServer) -> RunningServer:
        if server.owned:
            self._started.append(server)
        return server

    def stop(self) -> None:
        """Stop the servers this object started (not borrowed ones), Postgres last."""
        stopped = {server.name: server.pid for server in self._started}
        for server in sorted(self._started, key=lambda s: s.name == "postgres"):
            server.stop()
        self._started.clear()
        if not stopped:
            return
        with _locked(self.data_dir / "embedded.lock"):
            state = self._read_state()
            for name, pid in stopped.items():
                if state.get(name, {}).get("pid") == pid:  # not one someone started since
                    del state[name]
            if state:
                write_private(self._state_file, json.dumps(state, indent=2))
            else:
                self._state_file.unlink(missing_ok=True)


def _nats_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether a NATS server greets us (its INFO line) at `url`."""
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(4096).startswith(b"INFO")
    except OSError:
        return False
