"""A launcher that runs real runners for the runner tests without the orchestrator's engine:
it follows the log and, for every requested activation, builds the runner input with the
orchestrator's own reader (history after the last compaction, the batch's signals, the
checkpoint), mints a token, starts `python -m suzumio.runner run` as a process, and writes the
activation's lifecycle from its exit — so a test can tailor each input (`customise`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Self

from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent, EventMeta, decode_data
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationOutputRecorded,
    ActivationRequested,
    ActivationStarted,
)
from suzumio.contracts.policies import broker_policies
from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    RunnerConfig,
    SessionRef,
)
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import ModelSpec, ToolPolicy
from suzumio.orchestrator.sessions import load_session
from suzumio.platform.bus.eventstore import EventStore, envelopes_of
from suzumio.platform.bus.follower import LogFollower
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.tokens import TokenSigner

Customise = Callable[[RunnerActivationInput], RunnerActivationInput]


@dataclass
class Run:
    activation_id: str
    session_id: str
    input_path: Path
    exit_code: int | None = None
    stderr: str = ""


@dataclass
class RunnerLauncher:
    nc: NATS
    topology: Topology
    store: EventStore
    secret_key: str
    broker_url: str
    model_url: str
    workdir: Path
    model: str = "primary"
    fallbacks: tuple[str, ...] = ()
    config: RunnerConfig = field(default_factory=RunnerConfig)
    customise: Customise | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Only this session's activations: an earlier test's session may still be retried by the
    # scheduler (a failed activation's backoff) while this test runs, against this model.
    session_id: str | None = None
    runs: dict[str, Run] = field(default_factory=dict)
    _procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _loop: asyncio.Task[None] | None = None
    _follower: LogFollower | None = None
    ended: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def __aenter__(self) -> Self:
        # Only what is requested from now on: earlier tests' activations are not ours.
        start = await stream_last_seq(self.nc, self.topology.events_stream) + 1
        self._follower = LogFollower(self.nc, self.topology, start_seq=start)
        await self._follower.start()
        self._loop = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._loop is not None
        assert self._follower is not None
        self._loop.cancel()
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._follower.close()

    async def wait_ended(self, count: int, timeout: float = 60.0) -> list[Run]:
        async with self.ended:
            await asyncio.wait_for(
                self.ended.wait_for(
                    lambda: sum(r.exit_code is not None for r in self.runs.values()) >= count
                ),
                timeout,
            )
        return [r for r in self.runs.values() if r.exit_code is not None]

    async def _follow(self) -> None:
        assert self._follower is not None
        while True:
            msg = await self._follower.next()
            if msg is None or ".session." not in msg.subject:
                continue
            for envelope in envelopes_of(msg.data):
                data = decode_data(envelope)
                if self.session_id not in (None, envelope.aggregate_id):
                    continue
                if isinstance(data, ActivationRequested):
                    task = asyncio.create_task(self._launch(envelope.aggregate_id, data))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif isinstance(data, ActivationCancelRequested):
                    proc = self._procs.get(data.activation_id)
                    if proc is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)

    async def _launch(self, session_id: str, request: ActivationRequested) -> None:
        parts = await load_session(self.store, session_id, request)  # as the orchestrator
        workspace = self.workdir / request.activation_id / "workspace"
        workspace.mkdir(parents=True)
        signer = TokenSigner([self.secret_key])

        def token(policies: Mapping[str, ToolPolicy] | None = None) -> str:
            return signer.issue(
                activation_id=request.activation_id,
                session_id=session_id,
                project_id=parts.project_id,
                agent_id=request.agent_id,
                ttl=timedelta(minutes=10),
                policies=policies,
            )

        spec = RunnerActivationInput(
            project=ProjectRef(id=parts.project_id, name="test project"),
            agent=AgentSpec(
                id=request.agent_id,
                role="a test agent",
                prompt="Do what you are asked.",
                model=ModelSpec(name=self.model),
                fallbacks=tuple(ModelSpec(name=f) for f in self.fallbacks),
            ),
            session=SessionRef(id=session_id),
            activation=ActivationSpec(
                id=request.activation_id, signals=parts.signals, attempt=request.attempt
            ),
            workspace=str(workspace),
            controller_url=self.broker_url,
            token=token(),
            runner=self.config,
            history=parts.history,
            checkpoint=parts.checkpoint,
        )
        if self.customise is not None:
            spec = self.customise(spec)
            # The policy the test gave the agent, in its token too, as the orchestrator does.
            policies = broker_policies(spec.permissions, spec.default_permission)
            if policies:
                spec = spec.model_copy(update={"token": token(policies)})
        input_path = self.workdir / request.activation_id / "input.json"
        input_path.write_text(spec.model_dump_json())
        run = Run(request.activation_id, session_id, input_path)
        self.runs[request.activation_id] = run
        await self._append(
            request.activation_id,
            ActivationStarted(
                session_id=session_id,
                project_id=parts.project_id,
                agent_id=request.agent_id,
                backend="test-process",
            ),
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "SUZUMIO_MODEL_BASE_URL": f"{self.model_url}/v1",
            "SUZUMIO_MODEL_API_KEY": "sk-test-key-never-logged",
            **self.env,
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "suzumio.runner",
            "run",
            str(input_path),
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._procs[request.activation_id] = proc
        _, stderr = await proc.communicate()
        self._procs.pop(request.activation_id, None)
        run.stderr = stderr.decode(errors="replace")
        await self._finish(run, proc.returncode if proc.returncode is not None else -1)

    async def _finish(self, run: Run, code: int) -> None:
        stream = await self.store.load("activation", run.activation_id)
        output = next(
            (e.data for e in stream.events if isinstance(e.data, ActivationOutputRecorded)), None
        )
        end: DomainEvent
        if code < 0:
            end = ActivationCancelled(reason=f"killed by signal {-code}")
        elif output is not None and code in {0, 3, 4}:
            end = ActivationCompleted(text=output.text, usage=output.usage, reason=output.reason)
        else:
            end = ActivationFailed(reason=f"runner exit {code}", exit_code=code)
        await self._append(run.activation_id, end)
        run.exit_code = code
        async with self.ended:
            self.ended.notify_all()

    async def _append(self, activation_id: str, event: DomainEvent) -> None:
        await self.store.append_next(
            activation_id, [event], EventMeta(actor="system:test-launcher")
        )


def dump(value: Any) -> str:
    return json.dumps(value, indent=1, default=str)[:4_000]
