"""Test tiers come from the folder (unit/, integration/, e2e/, fault/, bench/); a run that
collects no test is a failure, not a success."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

from suzumio.runner import strays

TIERS = ("unit", "integration", "e2e", "fault", "bench")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _no_command_carried_over() -> Iterator[None]:
    """The runner's note of the commands an activation started is process-wide. A test that
    ran a shell command in this process without ending an activation must not leave it to the
    next one, whose end would then take this process's later children (its servers) for a
    command's."""
    yield
    strays._Started.commands = False
    strays._Started.before = frozenset()


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """For a test that configures logging as a service does (its lines then go to the captured
    stderr): the logging set-up it changed is put back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("uvicorn.access", "nats", "asyncio")}
    yield capsys
    structlog.reset_defaults()
    root.handlers[:], root.level = handlers, level
    for name, was in levels.items():
        logging.getLogger(name).setLevel(was)
