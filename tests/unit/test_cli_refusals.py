"""Wrong input to a command is refused with a line naming it and a non-zero exit, never a
traceback: ports out of range, an API key no HTTP header can carry, an unreadable key file."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from suzumio.cli.admin import ADMIN_KEY_FILE
from suzumio.cli.app import app
from suzumio.cli.supervisor import Supervisor


@pytest.fixture(autouse=True)
def logging_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command would point structlog at CliRunner's stderr, closed once it returns.
    monkeypatch.setattr("suzumio.cli.app.configure_logging", lambda *_, **__: None)


def run(data_dir: Path, *args: str, **env: str) -> Result:
    clean: dict[str, str | None] = {
        "SUZUMIO_API_KEY": None, "SUZUMIO_DATA_DIR": str(data_dir), "COLUMNS": "200"
    }  # fmt: skip
    return CliRunner().invoke(app, list(args), env={**clean, **env})


def refused(result: Result, code: int, *expected: str) -> None:
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    assert result.exit_code == code, result.output
    for text in expected:
        assert text in result.output, result.output


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--api-port", "70000"),
        ("--broker-port", "0"),
        ("--internal-ports-from", "65534"),  # its four ports would pass 65535
        ("--internal-ports-from", "-1"),
    ],
)
def test_up_refuses_a_port_out_of_range_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, value: str
) -> None:
    def started(self: Supervisor) -> int:
        pytest.fail("up got past its options")  # and would have started the whole platform

    monkeypatch.setattr(Supervisor, "run", started)
    refused(run(tmp_path, "up", option, value), 2, f"Invalid value for '{option}'")


@pytest.fixture
def package(tmp_path: Path) -> Path:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "agent.yaml").write_text("name: a\n")
    return tmp_path / "agent"


def import_agent(data_dir: Path, package: Path, *args: str, **env: str) -> Result:
    # Nothing listens at the API: every case here must stop before any request.
    return run(data_dir, "agents", "import", str(package), "--project", "p",
               "--api", "http://127.0.0.1:9", *args, **env)  # fmt: skip


def test_a_key_no_header_can_carry_is_refused_naming_where_it_came_from(
    tmp_path: Path, package: Path
) -> None:
    given = import_agent(tmp_path, package, "--key", "szm_é")
    refused(given, 2, "API key from --key", "printable ASCII")
    assert "é" not in given.output  # a key, even a wrong one, is not echoed

    from_env = import_agent(tmp_path, package, SUZUMIO_API_KEY="szm_ab\x01cd")
    refused(from_env, 2, "API key from SUZUMIO_API_KEY")

    (tmp_path / ADMIN_KEY_FILE).write_text("szm_ключ\n")
    refused(import_agent(tmp_path, package), 2, f"API key from {tmp_path / ADMIN_KEY_FILE}")


def test_an_unreadable_admin_key_file_is_refused_naming_it(tmp_path: Path, package: Path) -> None:
    key_file = tmp_path / ADMIN_KEY_FILE
    key_file.mkdir()  # as root, a directory is what reading cannot get past
    refused(import_agent(tmp_path, package), 2, f"cannot read the API key in {key_file}")

    key_file.rmdir()
    key_file.write_bytes(b"szm_\xff\xfe\n")
    refused(import_agent(tmp_path, package), 2, f"{key_file} holds no API key")


def test_the_data_directorys_admin_key_goes_only_to_an_api_on_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--api` naming another host, with no key given: the platform's own admin key is not
    sent there (nothing is sent); to this machine's API it is."""
    (tmp_path / ADMIN_KEY_FILE).write_text("szm_local_admin_key\n")
    sent: list[tuple[str, object]] = []

    def request(method: str, url: str, **options: object) -> object:
        sent.append((url, options.get("headers")))
        raise httpx.ConnectError("not here", request=httpx.Request(method, url))

    monkeypatch.setattr(httpx, "request", request)
    monkeypatch.setattr("suzumio.cli.rest.RETRY_DELAYS", ())
    for elsewhere in ("http://192.0.2.7:8080", "https://api.example.com", "http://[2001:db8::1]"):
        said = run(tmp_path, "projects", "create", "x", "--api", elsewhere)
        refused(said, 2, "the data directory's admin key is sent only to an API on this machine")
    assert sent == []
    for here in ("http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"):
        refused(run(tmp_path, "projects", "create", "x", "--api", here), 1, "could not reach")
    assert [headers["authorization"] for _, headers in sent] == [  # type: ignore[index]
        "Bearer szm_local_admin_key"
    ] * 3
