"""Commands a person runs fail with one line naming what is wrong, a non-zero exit and no
traceback: unreachable servers, a wrong API address or answer, a wrong setting."""

from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from suzumio.cli.rest import RETRY_DELAYS
from suzumio.platform.embedded.process import free_port
from tests.support import one_line_error


async def suzumio(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "suzumio.cli", *args],
        env={**clean, "COLUMNS": "200", **env}, capture_output=True, text=True, timeout=40,
        check=False,
    )  # fmt: skip


async def test_unreachable_nats_is_an_error_within_seconds() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = await suzumio(
        "projections", "status", SUZUMIO_NATS_URL=url, SUZUMIO_DATABASE_URL="postgresql://x@h/d"
    )
    one_line_error(done, 1, f"NATS at {url}")
    assert time.monotonic() - started < 20


async def test_unreachable_postgres_is_an_error_without_traceback(nats_url: str) -> None:
    port = free_port()
    done = await suzumio(
        "projections", "status", SUZUMIO_NATS_URL=nats_url,
        SUZUMIO_DATABASE_URL=f"postgresql://postgres:hunter2@127.0.0.1:{port}/suzumio",
    )  # fmt: skip
    one_line_error(done, 1, f"Postgres at postgresql://postgres:***@127.0.0.1:{port}/suzumio")
    assert "hunter2" not in done.stderr


async def test_a_wrong_log_level_names_the_variable() -> None:
    done = await suzumio("projections", "status", SUZUMIO_LOG_LEVEL="loud")
    one_line_error(done, 2, "SUZUMIO_LOG_LEVEL", "'loud'")


async def test_up_with_a_wrong_cpu_policy_names_the_variable_and_starts_nothing(
    tmp_path: Path,
) -> None:
    done = await suzumio("up", SUZUMIO_CPU_POLICY="fastest", SUZUMIO_DATA_DIR=str(tmp_path))
    one_line_error(done, 2, "SUZUMIO_CPU_POLICY", "'fastest'")
    assert list(tmp_path.iterdir()) == []  # no embedded server was started


async def test_log_level_in_capitals_is_accepted(tmp_path: Path) -> None:
    # The command gets past the settings and stops where it should: at the missing key.
    done = await suzumio(
        "agents", "import", str(tmp_path), "--project", "p",
        SUZUMIO_LOG_LEVEL="DEBUG", SUZUMIO_DATA_DIR=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no API key" in done.stderr


@pytest.fixture
def api_answering() -> Iterator[tuple[list[tuple[int, str, bytes]], str]]:
    """A loopback HTTP server answering each POST with the next (status, type, body)."""
    answers: list[tuple[int, str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            self.rfile.read(int(self.headers.get("content-length", 0)))
            status, content_type, body = answers.pop(0)
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield answers, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def import_agent(tmp_path: Path, api: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "agent.yaml").write_text("name: a\n")
    return await suzumio(
        "agents", "import", str(tmp_path), "--project", "p", "--api", api, SUZUMIO_API_KEY="k"
    )


async def test_import_against_an_unreachable_api(tmp_path: Path) -> None:
    api = f"http://127.0.0.1:{free_port()}"
    one_line_error(await import_agent(tmp_path, api), 1, f"could not reach the API at {api}")


async def test_import_with_an_api_url_without_scheme(tmp_path: Path) -> None:
    api = f"127.0.0.1:{free_port()}"
    one_line_error(await import_agent(tmp_path, api), 1, "needs a scheme", f"http://{api}")
    # Without a key too: the scheme is what is wrong, not the key (a URL without one is not
    # taken for this machine's, whose admin key would have been sent).
    (tmp_path / "agent.yaml").write_text("name: a\n")
    keyless = await suzumio("agents", "import", str(tmp_path), "--project", "p", "--api", api)
    one_line_error(keyless, 1, "needs a scheme", f"http://{api}")


async def test_import_answered_by_a_proxy_error_page_or_a_list(
    tmp_path: Path, api_answering: tuple[list[tuple[int, str, bytes]], str]
) -> None:
    answers, api = api_answering
    page = b"<html>\n<head><title>502 Bad Gateway</title></head>\n<body>nginx</body>\n</html>\n"
    # A proxy's 502 is asked again a few times (a gateway restarting): one that stays is said.
    answers.extend([(502, "text/html", page)] * (len(RETRY_DELAYS) + 1))
    one_line_error(await import_agent(tmp_path, api), 1, "502", "Bad Gateway")
    assert answers == []  # every retry was asked for

    answers.append((400, "application/json", b'["not", "an", "object"]'))
    one_line_error(await import_agent(tmp_path, api), 1, "400", '["not", "an", "object"]')

    answers.append((201, "application/json", b"[]"))
    one_line_error(await import_agent(tmp_path, api), 1, "201 without an agent")


async def test_reseal_without_a_secret_key_makes_none_and_says_so(tmp_path: Path) -> None:
    """No SUZUMIO_SECRET_KEY and no key file in the data directory: one line naming both, and
    no key made (a key made there could open nothing sealed before)."""
    done = await suzumio("secrets", "reseal", "--dry-run", SUZUMIO_DATA_DIR=str(tmp_path))
    one_line_error(done, 2, "SUZUMIO_SECRET_KEY", "secret.key")
    assert not (tmp_path / "secret.key").exists()


async def test_reseal_with_an_unreadable_key_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "secret.key").mkdir()  # there, but no file to read
    done = await suzumio("secrets", "reseal", "--dry-run", SUZUMIO_DATA_DIR=str(tmp_path))
    one_line_error(done, 2, "secret.key", "cannot be read")
