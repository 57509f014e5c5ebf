"""The first admin's key is never lost: `suzumio up` and `suzumio bootstrap-admin` save it
before BootstrapAdmin goes out, so an answer that never comes (a timeout, Ctrl-C, SIGKILL)
leaves the key that may yet be applied, and the next run sends that key again.
`suzumio bootstrap-admin` also says what happened when the session service does not answer."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from typer.testing import CliRunner, Result

from suzumio.cli import admin
from suzumio.cli.admin import ADMIN_KEY_FILE, AdminUnconfirmedError, KeyFileError, bootstrap_admin
from suzumio.cli.app import app
from suzumio.cli.supervisor import Supervisor
from suzumio.contracts.commands import BootstrapAdmin, CommandAccepted
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.subjects import Topology
from suzumio.platform import apikeys
from suzumio.platform.bus.commands import CommandContext, CommandRouter, CommandServer
from suzumio.platform.settings import PlatformSettings


@pytest.fixture(autouse=True)
def logging_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command would point structlog at CliRunner's stderr, closed once it returns.
    monkeypatch.setattr("suzumio.cli.app.configure_logging", lambda *_, **__: None)


@dataclass
class FakeSession:
    """The session service's BootstrapAdmin as a test steers it: applies every command it
    gets, then answers "ok", refuses ("conflict") or never answers ("never")."""

    answer: str = "ok"
    applied: list[BootstrapAdmin] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, ctx: CommandContext[BootstrapAdmin]) -> CommandAccepted:
        self.applied.append(ctx.command)
        if self.answer == "conflict":
            raise ConflictError("the platform has its first admin already")
        if self.answer == "never":
            await self.release.wait()
        return CommandAccepted()


@pytest_asyncio.fixture
async def session(nc: NATS, topology: Topology) -> AsyncIterator[FakeSession]:
    fake = FakeSession()
    router = CommandRouter("session")
    router.register(BootstrapAdmin, fake.handle)
    server = CommandServer(nc, topology, router)
    await server.start()
    yield fake
    fake.release.set()
    await server.drain(5)


@pytest.fixture
def quick_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "BOOTSTRAP_TIMEOUT", 0.5)


def assert_saved(path: Path, applied: BootstrapAdmin) -> str:
    """The key in `path` is the one `applied` made the admin's, readable by its owner only."""
    text = path.read_text().strip()
    parsed = apikeys.parse(text)
    assert parsed is not None, text
    assert (parsed[0], apikeys.digest(parsed[1])) == (applied.key_id, applied.digest)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return text


async def test_a_bootstrap_without_answer_keeps_the_key_it_sent(
    nc: NATS, topology: Topology, session: FakeSession, tmp_path: Path, quick_timeout: None
) -> None:
    session.answer = "never"
    with pytest.raises(AdminUnconfirmedError) as raised:
        await bootstrap_admin(nc, topology, tmp_path)
    [applied] = session.applied
    assert assert_saved(tmp_path / ADMIN_KEY_FILE, applied) == raised.value.key
    assert raised.value.key not in str(raised.value)  # the message may be logged

    # The next run sends the same key again, so whichever command applied, the file is right.
    session.answer = "ok"
    assert await bootstrap_admin(nc, topology, tmp_path) == raised.value.key
    assert session.applied[1] == applied
    session.answer = "conflict"
    assert await bootstrap_admin(nc, topology, tmp_path) is None
    assert_saved(tmp_path / ADMIN_KEY_FILE, applied)  # maybe the admin's: kept


async def test_a_bootstrap_cancelled_in_flight_keeps_the_key_it_sent(
    nc: NATS, topology: Topology, session: FakeSession, tmp_path: Path
) -> None:
    session.answer = "never"
    sending = asyncio.create_task(bootstrap_admin(nc, topology, tmp_path))
    while not session.applied:
        await asyncio.sleep(0.01)
    sending.cancel()  # what Ctrl-C does to `suzumio up` while it waits
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert_saved(tmp_path / ADMIN_KEY_FILE, session.applied[0])


async def test_a_refused_bootstrap_leaves_no_key_behind(
    nc: NATS, topology: Topology, session: FakeSession, tmp_path: Path
) -> None:
    session.answer = "conflict"
    assert await bootstrap_admin(nc, topology, tmp_path) is None
    assert len(session.applied) == 1
    assert not (tmp_path / ADMIN_KEY_FILE).exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary file either


async def test_a_key_file_that_cannot_be_kept_stops_the_command_before_it_is_sent(
    nc: NATS, topology: Topology, session: FakeSession, tmp_path: Path
) -> None:
    (tmp_path / ADMIN_KEY_FILE).mkdir()
    with pytest.raises(KeyFileError, match="cannot read"):
        await bootstrap_admin(nc, topology, tmp_path)
    (tmp_path / ADMIN_KEY_FILE).rmdir()
    (tmp_path / ADMIN_KEY_FILE).write_text("my notes\n")
    with pytest.raises(KeyFileError, match="holds no API key"):
        await bootstrap_admin(nc, topology, tmp_path)
    assert (tmp_path / ADMIN_KEY_FILE).read_text() == "my notes\n"
    assert session.applied == []


async def test_up_says_when_the_admin_is_not_confirmed(
    nats_url: str, topology: Topology, session: FakeSession, tmp_path: Path, quick_timeout: None
) -> None:
    session.answer = "never"
    settings = PlatformSettings(data_dir=tmp_path, namespace=topology.namespace)
    banner = await Supervisor(settings)._bootstrap_admin(nats_url)
    assert "NOT CONFIRMED" in banner, banner
    assert str(tmp_path / ADMIN_KEY_FILE) in banner
    assert_saved(tmp_path / ADMIN_KEY_FILE, session.applied[0])


async def bootstrap_admin_command(
    nats_url: str, database_url: str, topology: Topology, data_dir: Path
) -> Result:
    env = {"SUZUMIO_NATS_URL": nats_url, "SUZUMIO_DATABASE_URL": database_url,
           "SUZUMIO_NAMESPACE": topology.namespace, "SUZUMIO_DATA_DIR": str(data_dir),
           "COLUMNS": "200"}  # fmt: skip
    # In a thread: the command runs its own event loop, and the fake session needs ours.
    return await asyncio.to_thread(lambda: CliRunner().invoke(app, ["bootstrap-admin"], env=env))


async def test_bootstrap_admin_command_without_a_session_service(
    nats_url: str, database_url: str, topology: Topology, tmp_path: Path
) -> None:
    done = await bootstrap_admin_command(nats_url, database_url, topology, tmp_path)
    assert isinstance(done.exception, SystemExit), done.exception
    assert done.exit_code == 1, done.output
    assert "no session service is answering" in done.output


async def test_bootstrap_admin_command_without_answer_shows_the_key_it_sent(
    nats_url: str, database_url: str, topology: Topology, session: FakeSession,
    quick_timeout: None, tmp_path: Path,
) -> None:  # fmt: skip
    session.answer = "never"
    done = await bootstrap_admin_command(nats_url, database_url, topology, tmp_path)
    assert isinstance(done.exception, SystemExit), done.exception
    assert done.exit_code == 1, done.output
    assert "no reply in time" in done.output
    [applied] = session.applied
    # Log records land on stdout too here, with the CLI's own logging set aside.
    [key] = [line for line in done.stdout.splitlines() if line.startswith("szm_")]
    key_id, secret = apikeys.parse(key) or ("", "")
    assert (key_id, apikeys.digest(secret)) == (applied.key_id, applied.digest)
    assert_saved(tmp_path / ADMIN_KEY_FILE, applied)


async def test_bootstrap_admin_command_keeps_the_key_before_sending_and_sends_it_again(
    nats_url: str, database_url: str, topology: Topology, session: FakeSession,
    quick_timeout: None, tmp_path: Path,
) -> None:  # fmt: skip
    # An interrupted run (here: no answer) leaves the key it sent in the data directory, so
    # the admin it may have made is never one whose key nobody has; the next run resends it.
    session.answer = "never"
    first = await bootstrap_admin_command(nats_url, database_url, topology, tmp_path)
    assert first.exit_code == 1, first.output
    saved = assert_saved(tmp_path / ADMIN_KEY_FILE, session.applied[0])
    session.answer = "ok"
    again = await bootstrap_admin_command(nats_url, database_url, topology, tmp_path)
    assert again.exit_code == 0, again.output
    assert saved in again.stdout.splitlines()
    assert session.applied[1] == session.applied[0]
    assert str((tmp_path / ADMIN_KEY_FILE).resolve()) in again.stderr


async def test_bootstrap_admin_command_with_an_unusable_key_file_sends_nothing(
    nats_url: str, database_url: str, topology: Topology, session: FakeSession, tmp_path: Path
) -> None:
    (tmp_path / ADMIN_KEY_FILE).write_text("my notes\n")
    done = await bootstrap_admin_command(nats_url, database_url, topology, tmp_path)
    assert done.exit_code == 2, done.output
    assert "holds no API key" in done.stderr
    assert session.applied == []
    assert (tmp_path / ADMIN_KEY_FILE).read_text() == "my notes\n"


async def test_bootstrap_admin_command_where_the_key_cannot_be_kept_sends_nothing(
    nats_url: str, database_url: str, topology: Topology, session: FakeSession, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    done = await bootstrap_admin_command(nats_url, database_url, topology, tmp_path / "file" / "d")
    assert done.exit_code == 2, done.output
    assert str(tmp_path / "file" / "d" / ADMIN_KEY_FILE) in done.stderr
    assert "SUZUMIO_DATA_DIR" in done.stderr
    assert session.applied == []
