"""schemathesis against the live OpenAPI document: no server errors, and every response
matches the schema it is documented with (bounded in time and examples)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.api import new_world
from tests.e2e.stack import Stack


@pytest.mark.timeout(240)  # 40 s of fuzzing, the requests then in flight, the stack around it
async def test_no_server_errors_and_no_schema_violations(stack: Stack, tmp_path: Path) -> None:
    world = await new_world(stack, "fuzzer")  # a user with objects to find, not the admin
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{stack.api}/openapi.json",
        "--header",
        f"Authorization: Bearer {world.key}",
        "--checks",
        "not_a_server_error,response_schema_conformance,content_type_conformance",
        "--phases",
        "examples,fuzzing",
        "--max-examples",
        "12",
        "--max-time",
        "40",  # CI's whole run stays under 25 minutes
        "--workers",
        "2",
        "--generation-database",
        "none",
        "--no-color",
        "--request-timeout",
        "10",  # also ends the live streams it opens, which never end by themselves
        "--seed",
        "20261129",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=300, check=False
    )
    tail = (done.stdout + done.stderr)[-6_000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout, tail
