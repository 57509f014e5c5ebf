"""The launch plan of an activation (DESIGN.md §7): the runner input with the session's active
history, the batch's signals, the tools and toolpacks and a signed token; the sandbox's
environment with the model endpoints and keys; the profile, the directories and the mounts.

Provider settings merge as server defaults < the project's provider named by the model: a
model spec without a provider uses the orchestrator's own endpoint (in `suzumio up` without a
key, the offline demo model); one with a provider uses that provider's URL and (unsealed,
here and only here) key.

Mount grants were canonicalised when they were granted; a plan checks them again, since what
lies on a granted path can change in between (a link put in place of a directory of it by
anyone who may write to its parent, an agent with a writable grant above it included).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from suzumio.contracts.envelope import EventEnvelope
from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.policies import broker_policies
from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    MountSpec,
    ProjectRef,
    RunnerActivationInput,
    RunnerConfig,
    RunnerToolpackSpec,
    SessionRef,
    ToolDefinition,
)
from suzumio.contracts.values import (
    NO_NETWORK_BACKENDS,
    NO_NETWORK_REFUSED,
    NetworkProfile,
    ProviderSpec,
    RuntimeProfileSpec,
    WorkspaceMode,
)
from suzumio.orchestrator.backends.base import WORKSPACE, LaunchPlan, MountPlan, labels_for
from suzumio.orchestrator.directory import Agent, Grant, Project, asset_files
from suzumio.orchestrator.sessions import SessionReader
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.secrets import SecretBox, SecretError
from suzumio.platform.tokens import TokenSigner


class PlanError(Exception):
    """The activation cannot be planned (unknown agent, missing provider, …): not retryable."""


def _overlaps(path: str, other: str) -> bool:
    return (
        path == other
        or path.startswith(other.rstrip("/") + "/")
        or other.startswith(path.rstrip("/") + "/")
    )


def _provider(project: Project, name: str) -> ProviderSpec:
    provider = project.providers.get(name)
    if provider is None:
        raise PlanError(f"provider {name!r} does not exist")
    if provider.kind != "openai":  # stored before the session service refused other kinds
        raise PlanError(
            f"provider {name!r} is of kind {provider.kind!r}, which is not supported yet:"
            " the runner speaks the OpenAI API only"
        )
    return provider


def checked_mounts(grants: Iterable[Grant], reserved: Sequence[Path]) -> tuple[MountPlan, ...]:
    """The grants' mounts, if each host path is still the canonical directory it was when it
    was granted and shares nothing with `reserved` (the platform's own directories: every
    activation's input with its token is there); else `PlanError`."""
    own = [os.path.realpath(p) for p in reserved]
    mounts: list[MountPlan] = []
    for grant in grants:
        real = os.path.realpath(grant.host_path)
        if real != grant.host_path:
            raise PlanError(
                f"mount grant {grant.host_path} now resolves to {real} (a link in its path "
                "since it was granted): refused; grant the real directory again if it is meant"
            )
        if not Path(real).is_dir():
            raise PlanError(f"mount grant {grant.host_path} is no longer an existing directory")
        if clash := next((p for p in own if _overlaps(real, p)), None):
            raise PlanError(
                f"mount grant {grant.host_path} overlaps the platform's own directory {clash}"
            )
        mounts.append(MountPlan(Path(real), grant.target, grant.writable))
    return tuple(mounts)


MOUNT_CHECK_SECONDS = 10.0  # a grant's host path that takes longer is refused
MOUNT_CHECKS_AT_ONCE = 8  # threads left resolving grants (stuck ones count) before refusing
_mount_checks = threading.BoundedSemaphore(MOUNT_CHECKS_AT_ONCE)


async def _resolved_off_loop(check: Callable[[], tuple[MountPlan, ...]]) -> tuple[MountPlan, ...]:
    """`check()` in a thread of its own, given `MOUNT_CHECK_SECONDS`. A grant's host path on a
    stalled network filesystem would hold the orchestrator's loop — every watch, cancel and
    its leader lock — for as long as it is resolved; in the loop's own executor it would hold
    a thread the process backend's work needs, for good, and keep the process from exiting.
    So: a daemon thread, at most `MOUNT_CHECKS_AT_ONCE` of them (a thread stuck in the kernel
    keeps its place), and a plan that waits longer fails, saying why."""
    if not _mount_checks.acquire(blocking=False):
        raise PlanError("mount grants are not answering (their file systems stall): refused")
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[tuple[MountPlan, ...]] = loop.create_future()

    def settle(result: tuple[MountPlan, ...] | None, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result or ())

    def run() -> None:
        try:
            result, error = check(), None
        except BaseException as exc:  # handed to the awaiting plan, whatever it is
            result, error = None, exc
        finally:
            _mount_checks.release()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="mount-check", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(answer), MOUNT_CHECK_SECONDS)
    except TimeoutError:
        answer.add_done_callback(lambda done: done.exception())  # its end, when it comes
        raise PlanError(
            f"a mount grant's file system did not answer within {MOUNT_CHECK_SECONDS:g} s"
        ) from None


@dataclass
class Planner:
    store: EventStore
    signer: TokenSigner
    box: SecretBox | None
    settings: OrchestratorSettings
    namespace: str = ""

    def __post_init__(self) -> None:
        self._sessions = SessionReader(self.store)

    def keeps(self, session_id: str) -> bool:
        """Whether a fold of the session is kept (only its messages are worth observing)."""
        return self._sessions.keeps(session_id)

    def observe(self, session_id: str, seq: int, envelopes: Sequence[EventEnvelope]) -> None:
        """A message of a session's subject as the followed log delivers it (in order): the
        plans of its requests then read nothing (`SessionReader.observe`)."""
        self._sessions.observe(session_id, seq, envelopes)

    def forget(self, activation_id: str) -> None:
        """The activation ended (planned or not)."""
        self._sessions.forget(activation_id)

    async def plan(
        self,
        session_id: str,
        request: ActivationRequested,
        agent: Agent | None,
        project: Project | None,
        stored_at: int = 0,
    ) -> LaunchPlan:
        """The plan of `request`, with its agent and project as they were when it was
        stored (the orchestrator's `Directory` at that point of the log); `stored_at`: the
        log's sequence that stored it (0: not stored, a dry run)."""
        if agent is None or not agent.project_id or project is None:
            raise PlanError(f"agent {request.agent_id} does not exist")
        profile = self.profile(agent, project)
        # Checked as it is planned only: a sandbox launched before the operator narrowed the
        # bounds is still found and watched by its profile.
        bounds, own_images = self.settings.bounds, self.settings.default_images()
        if (why := bounds.refusal(profile, own_images)) is not None:
            raise PlanError(f"runtime profile {agent.runtime_profile!r}: {why}")
        snapshot = await self._sessions.snapshot(session_id, request, stored_at)
        offline = profile.network is NetworkProfile.NONE
        if offline and self.settings.broker_socket is None:
            raise PlanError(
                "network 'none' needs SUZUMIO_BROKER_SOCKET: the tool-broker's Unix socket, "
                "the sandbox's only way out"
            )
        # Without any network the model is called through the broker's relay, which holds the
        # endpoints and keys: the sandbox gets none of them.
        env, secrets = ({}, set()) if offline else self._model_env(agent, project)
        ttl = timedelta(seconds=profile.timeouts.wall_clock_seconds)
        token = self.signer.issue(
            activation_id=request.activation_id,
            session_id=session_id,
            project_id=agent.project_id,
            agent_id=agent.id,
            toolpacks=agent.toolpacks,
            ttl=ttl + timedelta(seconds=self.settings.token_margin_seconds),
            keyless=offline,  # nor does the broker give it one (`/runner/credentials`)
            # The broker holds the policy for what it does itself: a command in the sandbox
            # can call it with this token, past the runner.
            policies=broker_policies(agent.permissions),
        )
        mounts = await self._mounts(agent, project)
        spec = RunnerActivationInput(
            project=ProjectRef(id=project.id, name=project.name or project.id),
            agent=AgentSpec(
                id=agent.id,
                role=agent.role,
                prompt=agent.prompt,
                model=agent.model,
                fallbacks=agent.fallbacks,
                env_facts=agent.env_facts,
            ),
            session=SessionRef(id=session_id),
            activation=ActivationSpec(
                id=request.activation_id,
                signals=snapshot.signals,
                attempt=request.attempt,
                earlier_attempts=snapshot.earlier_attempts[-1_000:],
                summarized_message_ids=snapshot.summarized[-1_000:],
            ),
            workspace=WORKSPACE,
            controller_url=self.settings.broker_url,
            token=token,
            # The orchestrator enforces the limit; the runner's own is a backstop behind it.
            # The profile's loop settings replace the platform's defaults where they are set.
            runner=RunnerConfig.model_validate(
                {
                    "wall_clock_seconds": profile.timeouts.wall_clock_seconds + 60,
                    **profile.loop.overrides(),
                }
            ),
            tools=tuple(ToolDefinition(name=t) for t in agent.tools),
            toolpacks=tuple(RunnerToolpackSpec(name=t) for t in agent.toolpacks),
            permissions=agent.permissions,
            mounts=tuple(MountSpec(path=m.target, writable=m.writable) for m in mounts),
            allow_private_network=self.settings.allow_private_network,
            history=snapshot.history,
            checkpoint=snapshot.checkpoint,
            assets=asset_files(agent),
        )
        ids = {
            "SUZUMIO_PROJECT_ID": project.id,
            "SUZUMIO_AGENT_ID": agent.id,
            "SUZUMIO_SESSION_ID": session_id,
            "SUZUMIO_ACTIVATION_ID": request.activation_id,
        }
        root = self.settings.sandboxes()
        plan = LaunchPlan(
            activation_id=request.activation_id,
            session_id=session_id,
            project_id=project.id,
            agent_id=agent.id,
            attempt=request.attempt,
            input=spec,
            profile=profile,
            env={**ids, **env},
            secret_keys=frozenset(secrets),
            host_dir=self.settings.activation_dir(request.activation_id),
            session_dir=root / "sessions" / session_id,
            mounts=mounts,
            deadline=datetime.now(UTC) + ttl,
            broker_socket=self.settings.broker_socket if offline else None,
            origins=snapshot.origins,
        )
        return LaunchPlan(**{**plan.__dict__, "labels": labels_for(plan, self.namespace)})

    def profile(self, agent: Agent, project: Project) -> RuntimeProfileSpec:
        """The runtime profile an activation of `agent` runs with."""
        if agent.runtime_profile is None:
            default = RuntimeProfileSpec(backend=self.settings.default_backend)
            return self.settings.bounds.clamp(default)
        profile = project.profiles.get(agent.runtime_profile)
        if profile is None:
            raise PlanError(f"runtime profile {agent.runtime_profile!r} does not exist")
        if profile.network is NetworkProfile.NONE and profile.backend not in NO_NETWORK_BACKENDS:
            # stored before it was refused
            raise PlanError(f"runtime profile {agent.runtime_profile!r}: {NO_NETWORK_REFUSED}")
        return profile

    def _model_env(self, agent: Agent, project: Project) -> tuple[dict[str, str], set[str]]:
        env: dict[str, str] = {}
        secrets: set[str] = set()
        models = (agent.model, *agent.fallbacks)
        # The server's default endpoint only for an agent with a model that names no provider:
        # a sandbox gets the keys its agent's models use, nothing else (DESIGN.md §7).
        if any(model.provider is None for model in models):
            if self.settings.model_base_url:
                env["SUZUMIO_MODEL_BASE_URL"] = self.settings.model_base_url
            if self.settings.model_api_key is not None:
                env["SUZUMIO_MODEL_API_KEY"] = self.settings.model_api_key.get_secret_value()
                secrets.add("SUZUMIO_MODEL_API_KEY")
        for model in models:
            if model.provider is None:
                continue
            provider = _provider(project, model.provider)
            key = re.sub(r"[^A-Z0-9]", "_", model.provider.upper())
            env[f"SUZUMIO_PROVIDER_{key}_BASE_URL"] = provider.base_url
            if provider.api_key is not None:
                if self.box is None:
                    raise PlanError("no secret key to open the provider's key with")
                try:
                    env[f"SUZUMIO_PROVIDER_{key}_API_KEY"] = self.box.open(provider.api_key)
                except SecretError as exc:
                    raise PlanError(f"provider {model.provider!r}: {exc}") from None
                secrets.add(f"SUZUMIO_PROVIDER_{key}_API_KEY")
        return env, secrets

    async def _mounts(self, agent: Agent, project: Project) -> tuple[MountPlan, ...]:
        if agent.workspace_mode is not WorkspaceMode.MOUNT:
            return ()
        grants = [g for g in project.grants.values() if g.agent_id in {None, agent.id}]

        def checked() -> tuple[MountPlan, ...]:
            reserved = (self.settings.data_dir, self.settings.sandboxes())
            return checked_mounts(grants, reserved)

        return await _resolved_off_loop(checked)
