"""A pool worker whose locale encodes no more than ASCII (`LC_ALL=C` with Python's UTF-8 mode
and locale coercion off, as an operator's environment may set them) writes a run's input as
UTF-8 all the same: written in the locale's encoding, a prompt with any other character
raised in the worker — the run ended with no word of its end, and no ack — where the runner
reads its input as UTF-8. Real NATS, a real worker process and runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from suzumio.orchestrator.backends.pool import PoolBackend
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    StartWorker,
    backend,
    fenced_url,
    make_plan,
    watch,
    workers,
)


async def test_a_run_in_an_ascii_locale_reads_its_input_whole(
    backend: PoolBackend,  # noqa: F811
    workers: StartWorker,  # noqa: F811
    fenced_url: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}.items():
        monkeypatch.setenv(name, value)
    workers("wa", "--cold")
    handle = await backend.launch(make_plan(fenced_url, tmp_path, prompt="réponds ✓ 简短"))

    result = await watch(backend, handle, timeout=60)

    assert (result.code, result.reason) == (6, "exited")  # as any run its broker refuses
