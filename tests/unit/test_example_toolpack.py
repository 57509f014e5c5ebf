"""The example toolpack `todo` (examples/toolpacks/todo), as each part of the platform loads it:
the manifest through the entry point, the tools through the runner's `Toolbox`, the support
operation as the broker calls it, the hook through the scheduler's `Hooks`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import TypeAdapter

from suzumio.contracts.commands import CommandAccepted
from suzumio.contracts.errors import InvalidError
from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    RunnerToolpackSpec,
    SessionRef,
)
from suzumio.contracts.scheduling import (
    AgentSchedulingState,
    EndedActivationView,
    HookAction,
    HookSignal,
    PendingSignalView,
)
from suzumio.contracts.toolpacks import ToolpackManifest, discover, discover_errors, resolve
from suzumio.contracts.values import ModelSpec, Priority, SignalKind
from suzumio.runner.broker import BrokerClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.scheduler import hooks as hooks_module
from suzumio.scheduler.hooks import Hooks, load_hooks
from suzumio_todo import hooks, support
from suzumio_todo.manifest import MANIFEST

# -- the manifest ---------------------------------------------------------------------------


def test_the_installed_entry_point_publishes_the_manifest() -> None:
    found = discover()
    assert "todo" not in discover_errors
    assert found["todo"] == MANIFEST
    assert ToolpackManifest.model_validate(MANIFEST.model_dump()) == MANIFEST


def test_every_code_reference_of_the_manifest_resolves() -> None:
    assert {t.name for t in MANIFEST.tools} == set(MANIFEST.runner_handlers)
    refs = [
        *MANIFEST.runner_handlers.values(),
        *MANIFEST.support_operations.values(),
        *MANIFEST.scheduler_hooks,
    ]
    assert all(callable(resolve(ref)) for ref in refs)
    assert set(MANIFEST.support_operations) == {"todo.remind"}
    [entry] = MANIFEST.web_entries
    assert entry.id == "todo"
    assert files("suzumio_todo").joinpath("web", entry.path).is_file()


# -- the tools, as the runner offers and runs them ------------------------------------------


def spec_for(workspace: Path, *toolpacks: str) -> RunnerActivationInput:
    return RunnerActivationInput(
        project=ProjectRef(id=new_id(), name="p"),
        agent=AgentSpec(id=new_id(), role="r", prompt="p", model=ModelSpec(name="m")),
        session=SessionRef(id=new_id()),
        activation=ActivationSpec(id=new_id()),
        workspace=str(workspace),
        controller_url="http://127.0.0.1:9",  # never called: the todo tools run in the sandbox
        token="unused",
        toolpacks=tuple(RunnerToolpackSpec(name=t) for t in toolpacks),
    )


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[BrokerClient]:
    client = BrokerClient("http://127.0.0.1:9", "unused")
    yield client
    await client.aclose()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def offered(box: Toolbox) -> set[str]:
    return {d["function"]["name"] for d in box.wire_definitions()}


async def test_an_activation_naming_todo_is_offered_its_tools(
    workspace: Path, broker: BrokerClient
) -> None:
    box = Toolbox(spec_for(workspace, "todo"), broker, ToolContext(workspace=workspace))
    assert {"todo_add", "todo_list"} <= offered(box)
    assert "shell_exec" not in offered(box)  # naming a toolpack replaces the default packs
    assert box.canonical("todo_add") == "todo.add"
    assert box.kind("todo.add", {"text": "x"}) == "exclusive"

    other = Toolbox(spec_for(workspace), broker, ToolContext(workspace=workspace))
    assert not {"todo_add", "todo_list"} & offered(other)


async def test_todo_add_writes_the_session_list_and_todo_list_reads_it(
    workspace: Path, broker: BrokerClient
) -> None:
    box = Toolbox(spec_for(workspace, "todo"), broker, ToolContext(workspace=workspace))
    empty = await box.run("todo.list", {}, "c0")
    assert (empty.result.status, empty.result.text) == ("ok", "The todo list is empty.")

    first = await box.run("todo.add", {"text": "  buy milk "}, "c1")
    second = await box.run("todo.add", {"text": "call Ana"}, "c2")
    assert (first.result.status, first.result.text) == ("ok", "Added item 1: buy milk")
    assert second.result.text == "Added item 2: call Ana"

    stored = json.loads((workspace / "session" / "todo.json").read_text())
    assert [(i["n"], i["text"]) for i in stored["items"]] == [(1, "buy milk"), (2, "call Ana")]
    assert sorted(p.name for p in (workspace / "session").iterdir()) == ["todo.json"]

    listed = await box.run("todo.list", {}, "c3")
    assert listed.result.text == "1. buy milk\n2. call Ana"


@pytest.mark.parametrize("args", [{}, {"text": ""}, {"text": "x" * 501}, {"text": "a", "b": 1}])
async def test_bad_arguments_are_an_error_result_and_write_nothing(
    workspace: Path, broker: BrokerClient, args: dict[str, Any]
) -> None:
    box = Toolbox(spec_for(workspace, "todo"), broker, ToolContext(workspace=workspace))
    outcome = await box.run("todo.add", args, "c1")
    assert outcome.result.status == "error"
    assert "invalid arguments" in outcome.result.text
    assert not (workspace / "session").exists()


async def test_a_list_that_is_not_a_todo_list_is_left_alone(
    workspace: Path, broker: BrokerClient
) -> None:
    path = workspace / "session" / "todo.json"
    path.parent.mkdir()
    path.write_text('{"items": "not a list"}')
    box = Toolbox(spec_for(workspace, "todo"), broker, ToolContext(workspace=workspace))
    outcome = await box.run("todo.add", {"text": "x"}, "c1")
    assert outcome.result.status == "error"
    assert path.read_text() == '{"items": "not a list"}'


# -- the support operation, as the broker calls it ------------------------------------------


class Recorder:
    """Stands in for the broker's `SupportContext`: what `todo.remind` asks it to record."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], Any, datetime | None]] = []

    async def record_signal(
        self, kind: str, payload: dict[str, Any], priority: Any, not_before: datetime | None
    ) -> CommandAccepted:
        self.calls.append((kind, payload, priority, not_before))
        return CommandAccepted(result={"signal_id": "s1"})


async def test_remind_records_a_routine_reminder_due_after_the_delay() -> None:
    ctx = Recorder()
    before = datetime.now(UTC)
    answer = await support.remind(ctx, {"text": "check the build", "delay_seconds": 60})
    [(kind, payload, priority, not_before)] = ctx.calls
    assert (kind, payload, priority) == ("todo.reminder", {"text": "check the build"}, Priority.P3)
    assert not_before is not None
    assert timedelta(seconds=60) <= not_before - before < timedelta(seconds=65)
    assert answer == {"signal_id": "s1", "delay_seconds": 60}

    await support.remind(ctx, {})
    assert ctx.calls[-1][3] is None  # no delay: due now


@pytest.mark.parametrize(
    "arguments", [{"delay_seconds": -1}, {"text": ""}, {"when": "later"}, {"delay_seconds": 1e9}]
)
async def test_remind_refuses_bad_arguments_and_records_nothing(arguments: dict[str, Any]) -> None:
    ctx = Recorder()
    with pytest.raises(InvalidError):
        await support.remind(ctx, arguments)
    assert ctx.calls == []


# -- the scheduler hook ---------------------------------------------------------------------

ENDED = "a-ended"


def state(
    *,
    outcome: str = "completed",
    useful: bool = True,
    pending: tuple[PendingSignalView, ...] = (),
    live: str | None = None,
    ended: bool = True,
    toolpacks: tuple[str, ...] = ("todo",),
) -> AgentSchedulingState:
    last = EndedActivationView.model_validate(
        {"id": ENDED, "outcome": outcome, "useful_effect": useful, "signal_ids": ("s0",)}
    )
    return AgentSchedulingState(
        project_id="p",
        agent_id="a",
        session_id="s",
        live_activation_id=live,
        pending=pending,
        last_activation=last if ended else None,
        toolpacks=toolpacks,
    )


async def test_an_idle_agent_after_useful_work_gets_one_reminder_for_later() -> None:
    before = datetime.now(UTC)
    answer = TypeAdapter(list[HookAction]).validate_python(await hooks.remind_when_idle(state()))
    [signal] = answer
    assert isinstance(signal, HookSignal)
    assert (signal.kind, signal.priority) == (SignalKind.CUSTOM, Priority.P3)
    assert signal.key == f"todo.reminder:{ENDED}"
    assert signal.payload["kind"] == "todo.reminder"
    assert signal.not_before is not None
    assert signal.not_before - before >= hooks.REMIND_AFTER
    again = await hooks.remind_when_idle(state())
    assert [a.key for a in again] == [signal.key]  # same activation, same key: recorded once


@pytest.mark.parametrize(
    "quiet",
    [
        state(ended=False),
        state(outcome="failed"),
        state(outcome="cancelled"),
        state(outcome="timed_out"),
        state(useful=False),
        state(pending=(PendingSignalView(id="x", kind=SignalKind.CUSTOM, priority=Priority.P3),)),
        state(live="a-live"),
    ],
    ids=["no-activation", "failed", "cancelled", "timed-out", "no-effect", "pending", "live"],
)
async def test_the_hook_is_quiet_otherwise(quiet: AgentSchedulingState) -> None:
    assert await hooks.remind_when_idle(quiet) == []


async def test_the_scheduler_runs_the_manifests_hook_for_agents_that_enable_todo_only() -> None:
    [ref] = MANIFEST.scheduler_hooks
    runner = Hooks(load_hooks(toolpacks={"todo": MANIFEST}))
    [hook] = [h for h in runner.hooks if h.toolpacks is not None]
    assert (hook.name, hook.call) == (f"todo:{ref}", resolve(ref))
    [(name, action)] = await runner.run(state())
    assert (name, action.key) == (f"todo:{ref}", f"todo.reminder:{ENDED}")
    assert await runner.run(state(toolpacks=())) == []
    assert await runner.run(state(toolpacks=("todo-not",))) == []
    # What the scheduler asks before it builds a state at all.
    assert (runner.any_for(("todo",)), runner.any_for(()), runner.any_for(("web",))) == (
        True,
        False,
        False,
    )


def test_a_toolpack_hook_also_named_for_every_agent_is_loaded_once_for_every_agent() -> None:
    [ref] = MANIFEST.scheduler_hooks
    [hook] = [h for h in load_hooks([ref], {"todo": MANIFEST}) if h.call is resolve(ref)]
    assert (hook.name, hook.toolpacks) == (ref, None)


async def test_a_hook_two_toolpacks_name_runs_for_agents_enabling_either_once() -> None:
    """The second toolpack's copy was dropped as "already for every agent": an agent that
    enabled only that toolpack never had the hook run."""
    [ref] = MANIFEST.scheduler_hooks
    twin = MANIFEST.model_copy(update={"name": "todo-twin"})
    runner = Hooks(load_hooks(toolpacks={"todo": MANIFEST, "todo-twin": twin}))
    [hook] = [h for h in runner.hooks if h.call is resolve(ref)]
    assert hook.toolpacks == frozenset({"todo", "todo-twin"})
    assert len(await runner.run(state(toolpacks=("todo-twin",)))) == 1
    assert len(await runner.run(state(toolpacks=("todo", "todo-twin")))) == 1  # not twice
    assert await runner.run(state(toolpacks=("web",))) == []


def test_a_hook_named_by_a_dotted_attribute_loads_as_the_manifests_handlers_do() -> None:
    [hook] = load_hooks(["os:path.join"])
    assert hook.call is resolve("os:path.join")


class Reminders:
    @classmethod
    async def remind(cls, _: AgentSchedulingState) -> list[HookSignal]:
        return []


def test_a_method_two_toolpacks_name_is_loaded_once() -> None:
    """Each lookup of `Class.method` makes a new bound method: compared by identity, the
    second toolpack's copy was loaded beside the first, and ran twice for an agent with both."""
    ref = f"{__name__}:Reminders.remind"
    one = MANIFEST.model_copy(update={"name": "one", "scheduler_hooks": (ref,)})
    two = MANIFEST.model_copy(update={"name": "two", "scheduler_hooks": (ref,)})
    [hook] = load_hooks(toolpacks={"one": one, "two": two})
    assert hook.toolpacks == frozenset({"one", "two"})


def test_a_hook_registered_as_an_entry_point_and_named_in_the_settings_is_loaded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loaded twice, it ran twice at every end under two names (each deriving its own ids):
    every action it took was taken twice."""
    [ref] = MANIFEST.scheduler_hooks

    class Point:
        name = "todo-reminders"

        @staticmethod
        def load() -> object:
            return resolve(ref)

    monkeypatch.setattr(hooks_module, "entry_points", lambda group: [Point()])
    loaded = load_hooks([ref, ref])
    assert [(h.name, h.toolpacks) for h in loaded] == [("todo-reminders", None)]
