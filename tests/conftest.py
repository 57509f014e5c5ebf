"""Test tiers come from the folder (unit/, integration/, e2e/, fault/, bench/); a run that
collects no test is a failure, not a success."""

from __future__ import annotations

import pytest

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
