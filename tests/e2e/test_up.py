"""`suzumio up` from nothing: embedded servers, five services, all ready; SIGTERM leaves no
process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from suzumio.cli.admin import ADMIN_KEY_FILE
from suzumio.platform.embedded.process import free_port, free_port_run
from suzumio.testing.processes import http_status
from tests.support import cpu_policies, policy_for


async def wait_for_line(
    stream_path: Path, text: str, process: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while text not in stream_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(stream_path.read_text(errors="replace")[-5000:])
        await asyncio.sleep(0.2)


async def demo_answer(api_port: int, data_dir: Path) -> str:
    """With no model key set, a message sent through the API is answered by the offline
    demo model on the embedded default (process) backend."""
    key = (data_dir / ADMIN_KEY_FILE).read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{api_port}", headers=headers, timeout=30
    ) as c:
        project = (await c.post("/v1/projects", json={"name": "demo"})).json()
        agent = (
            await c.post(
                f"/v1/projects/{project['id']}/agents",
                json={"name": "helper", "role": "a helpful assistant", "model": {"name": "any"}},
            )
        ).json()
        session = (
            await c.post(f"/v1/projects/{project['id']}/sessions", json={"agent_id": agent["id"]})
        ).json()
        sent = await c.post(f"/v1/sessions/{session['id']}/messages", json={"text": "hello"})
        assert sent.status_code == 201, sent.text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            items = (await c.get(f"/v1/sessions/{session['id']}/messages")).json()["items"]
            answers = [m["text"] for m in items if m.get("role") == "assistant" and m["text"]]
            if answers:
                return str(answers[-1])
            await asyncio.sleep(0.5)
    raise AssertionError("no answer from the demo model within 60 s")


def cli_conversation(api_port: int, env: dict[str, str]) -> str:
    """The README's conversation through the CLI, which finds the admin key in the data
    directory by itself: the text `suzumio chat` printed."""
    env = {**env, "SUZUMIO_API_URL": f"http://127.0.0.1:{api_port}"}

    def suzumio(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "suzumio.cli", *args],
            env=env, capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout.strip()

    project = suzumio("projects", "create", "demo")
    agent = suzumio("agents", "create", project, "writer", "--model", "demo")
    session = suzumio("sessions", "create", project, "--agent", agent)
    return suzumio("chat", session, "hello")


async def test_up_starts_everything_and_sigterm_leaves_nothing_behind(tmp_path: Path) -> None:
    ports = {"api": free_port(), "broker": free_port()}
    internal = free_port_run(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    env |= {"SUZUMIO_DATA_DIR": str(tmp_path / "data"), "SUZUMIO_LOG_FORMAT": "json"}
    out = tmp_path / "up.log"
    with out.open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "suzumio.cli", "up", "--api-port", str(ports["api"]),
             "--broker-port", str(ports["broker"]), "--internal-ports-from", str(internal)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        await wait_for_line(out, "Suzumio is up.", up, timeout=120)
        for port in (ports["api"], ports["broker"], internal, internal + 1, internal + 2):
            assert await http_status(port, "/readyz") == 200
        descendants = psutil.Process(up.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in descendants)
        for expected in (
            "nats-server",
            "postgres",
            "suzumio.gateway",
            "suzumio.session",
            "suzumio.scheduler",
            "suzumio.orchestrator",
            "suzumio.toolbroker",
            "suzumio.testing.model_server",
        ):
            assert expected in names
        # Every process of the platform, the embedded servers too, every thread of each, runs
        # under the platform's CPU policy (docs/operations.md).
        policies = {p.pid: cpu_policies(p.pid) for p in descendants}  # none: it ended
        batch = policy_for("batch")
        assert cpu_policies(up.pid) == {batch}
        assert all(found == {batch} for found in policies.values() if found), [
            (p.pid, policies[p.pid]) for p in descendants
        ]
        assert sum(1 for found in policies.values() if found) >= 8  # the servers and services

        assert "OFFLINE DEMO MODEL" in out.read_text()
        answer = await demo_answer(ports["api"], tmp_path / "data")
        assert answer.startswith("[offline demo model]"), answer
        said = await asyncio.to_thread(cli_conversation, ports["api"], env)
        assert said.startswith("[offline demo model]"), said

        started = time.monotonic()
        up.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(up.wait, 30)
        elapsed = time.monotonic() - started
    finally:
        if up.poll() is None:
            up.kill()

    assert code == 0, out.read_text()[-5000:]
    assert elapsed < 20
    _, alive = psutil.wait_procs(descendants, timeout=5)
    assert alive == [], [p.cmdline() for p in alive]
