"""The backend behaviour suite (tests/backend_suite.py) on the kubernetes backend, against a
FAKE Kubernetes API server (no cluster can run here). A fake kubelet plays the node: it runs
each Job's runner as a local process from the Job's Secret and ConfigMap — the input and the
environment exactly as the backend rendered them — and reports its exit to the fake API."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Self

import pytest
import pytest_asyncio

from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend
from suzumio.orchestrator.backends.kubernetes_render import KubernetesSettings
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.fake_kubernetes import FakeKubernetesServer
from suzumio.testing.model_server import ScriptedModelServer
from tests.backend_suite import SCENARIOS, Harness, harness
from tests.e2e.stack import Stack

NAMESPACE = "suzumio-sandboxes"


def _secret_value(secret: dict[str, Any], key: str) -> str:
    if key in secret.get("stringData", {}):
        return str(secret["stringData"][key])
    return base64.b64decode(secret["data"][key]).decode()


class FakeKubelet:
    """Runs the runner of every started Job of the fake API as a local process."""

    def __init__(self, server: FakeKubernetesServer, workdir: Path) -> None:
        self._server = server
        self._workdir = workdir
        self._running: dict[str, asyncio.subprocess.Process] = {}
        self._seen: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for proc in self._running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def _loop(self) -> None:
        while True:
            jobs = {j["metadata"]["name"]: j for j in self._server.objects("Job", NAMESPACE)}
            for name, job in jobs.items():
                if name not in self._seen and not job["spec"].get("suspend"):
                    self._seen.add(name)
                    asyncio.create_task(self._run(job))  # noqa: RUF006 - ends on its own
            for name in list(self._running):
                if name not in jobs:  # deleted (cancelled): the node kills the pod
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self._running.pop(name).pid, signal.SIGKILL)
            await asyncio.sleep(0.05)

    async def _run(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        secrets = {s["metadata"]["name"]: s for s in self._server.objects("Secret", NAMESPACE)}
        maps = {m["metadata"]["name"]: m for m in self._server.objects("ConfigMap", NAMESPACE)}
        [container] = job["spec"]["template"]["spec"]["containers"]
        env: dict[str, str] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                env |= maps[source["configMapRef"]["name"]].get("data", {})
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                env[item["name"]] = _secret_value(secrets[ref["name"]], ref["key"])
            elif "value" in item:
                env[item["name"]] = item["value"]
        secret = next(
            s
            for s in secrets.values()
            if "input.json" in (s.get("stringData") or s.get("data") or {})
        )
        spec = json.loads(_secret_value(secret, "input.json"))
        workspace = self._workdir / name / "workspace"
        workspace.mkdir(parents=True)
        spec["workspace"] = str(workspace)
        input_path = self._workdir / name / "input.json"
        input_path.write_text(json.dumps(spec))
        env["HOME"] = str(workspace)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "suzumio.runner", "run", str(input_path),
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self._running[name] = proc
        code = await proc.wait()
        if self._running.pop(name, None) is None:
            return  # killed because its Job was deleted
        with contextlib.suppress(KeyError):
            self._server.finish_job(name, exit_code=code, namespace=NAMESPACE)


@pytest_asyncio.fixture
async def fake_api(tmp_path: Path) -> AsyncIterator[FakeKubernetesServer]:
    async with (
        FakeKubernetesServer(namespaces=[NAMESPACE]) as server,
        FakeKubelet(server, tmp_path / "node"),
    ):
        yield server


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_kubernetes_backend_against_a_fake_api_server(
    platform: Stack,
    model: ScriptedModelServer,
    fake_api: FakeKubernetesServer,
    tmp_path: Path,
    scenario: Callable[[Harness], Awaitable[None]],
) -> None:
    async def kubernetes_backend(settings: OrchestratorSettings) -> Backend:
        k8s = KubernetesSettings(
            api_url=fake_api.url,
            namespace=NAMESPACE,
            image="suzumio-runner:latest",
            broker_url=settings.broker_url,
        )
        return KubernetesBackend(k8s, settings.namespace)

    async with harness(platform, model, tmp_path, kubernetes_backend, "kubernetes") as h:
        await scenario(h)
