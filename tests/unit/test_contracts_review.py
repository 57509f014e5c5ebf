"""Contracts review: bad input is refused where it enters, not where it breaks something later."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from suzumio.contracts.broker import CheckpointPut, SignalRecord, ToolCallFinish, ToolCallStart
from suzumio.contracts.commands import CommandRequest, RecordSignal
from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    SessionRef,
    SignalSpec,
)
from suzumio.contracts.values import MAX_JSON_DEPTH, ModelSpec, Priority, SignalKind
from suzumio.session.projections.tool_calls import ToolCallsProjection

INT32_MAX = 2**31 - 1
DIGEST = "0" * 64


def nested(levels: int) -> dict[str, Any]:
    """A JSON object `levels` objects deep."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


# -- the tool-call audit's integer columns ----------------------------------------------------
def test_the_audit_columns_the_bodies_feed_are_int32() -> None:
    ddl = ToolCallsProjection().ddl("s")
    for column in ("arguments_size", "result_size", "duration_ms"):
        assert f"{column} integer" in ddl


def test_a_tool_call_start_larger_than_an_int32_is_refused() -> None:
    start = {"call_id": "c", "tool": "t", "arguments_digest": DIGEST}
    fits = ToolCallStart.model_validate({**start, "arguments_size": INT32_MAX})
    assert fits.arguments_size == INT32_MAX
    # Accepted before, appended to the log, then parked by the projection (asyncpg: "value out
    # of int32 range"): the call was missing from the audit.
    with pytest.raises(ValidationError):
        ToolCallStart.model_validate({**start, "arguments_size": INT32_MAX + 1})


@pytest.mark.parametrize("field", ["result_size", "duration_ms"])
def test_a_tool_call_finish_larger_than_an_int32_is_refused(field: str) -> None:
    finish: dict[str, Any] = {"call_id": "c", "status": "ok", "duration_ms": 1}
    assert getattr(ToolCallFinish(**{**finish, field: INT32_MAX}), field) == INT32_MAX
    with pytest.raises(ValidationError):
        ToolCallFinish(**{**finish, field: INT32_MAX + 1})


# -- free-form JSON: depth and non-JSON numbers ------------------------------------------------
def _input_with(payload: dict[str, Any]) -> RunnerActivationInput:
    signal = SignalSpec(id="s1", kind=SignalKind.CUSTOM, priority=Priority.P3, payload=payload)
    return RunnerActivationInput(
        project=ProjectRef(id="p", name="p"),
        agent=AgentSpec(id="a", role="r", prompt="", model=ModelSpec(name="m")),
        session=SessionRef(id="s"),
        activation=ActivationSpec(id="act", signals=(signal,)),
        controller_url="http://broker",
        token="t",
    )


def test_a_payload_the_runner_could_never_read_is_refused_when_recorded() -> None:
    # ~199 levels fit in the command (and its event), not in the runner's input that carries
    # the signal on, which the runner parses with pydantic's JSON limit of 200 levels: the
    # signal was accepted and every activation given it failed to start.
    deep = nested(199)
    request = CommandRequest(service="session", verb="record_signal", actor="u", data={"p": deep})
    CommandRequest.model_validate_json(request.model_dump_json())  # the session service reads it
    carried = _input_with(deep).model_dump_json()
    with pytest.raises(ValidationError, match="recursion limit"):
        RunnerActivationInput.model_validate_json(carried)
    with pytest.raises(ValidationError, match="nests more than"):
        RecordSignal(session_id="s", signal_id="x", payload=deep)
    with pytest.raises(ValidationError, match="nests more than"):
        SignalRecord(payload=deep)


def test_json_as_deep_as_allowed_still_travels_to_the_runner() -> None:
    payload = nested(MAX_JSON_DEPTH)
    RecordSignal(session_id="s", signal_id="x", payload=payload)
    CheckpointPut(checkpoint_id="c", data=payload)
    carried = _input_with(payload).model_dump_json()
    received = RunnerActivationInput.model_validate_json(carried)
    assert received.activation.signals[0].payload == payload
    with pytest.raises(ValidationError):
        CheckpointPut(checkpoint_id="c", data={"x": [nested(MAX_JSON_DEPTH)]})


def test_very_deep_json_is_a_validation_error_not_a_recursion_error() -> None:
    # The NUL check recursed: deep JSON raised RecursionError out of validation, which an HTTP
    # service answers with a 500 instead of a 422.
    deep = nested(5_000)
    with pytest.raises(ValidationError):
        CheckpointPut(checkpoint_id="c", data=deep)
    with pytest.raises(ValidationError):
        RecordSignal(session_id="s", signal_id="x", payload=deep)


def test_the_nul_check_still_reaches_every_level() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        CheckpointPut(checkpoint_id="c", data={"a": [{"b": ["ok", "x\x00"]}]})
    with pytest.raises(ValidationError, match="NUL"):
        CheckpointPut(checkpoint_id="c", data={"a": {"k\x00": 1}})
    clean = {"a": [1, 2.5, None, True, "s"]}
    assert CheckpointPut(checkpoint_id="c", data=clean).data == clean


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_payload_with_a_non_json_number_is_refused(number: str) -> None:
    # Python's JSON reader (FastAPI's) takes NaN; the bus then carried it as null: the agent
    # got another payload than the one accepted.
    body = '{"session_id": "s", "signal_id": "x", "payload": {"v": %s}}' % number  # noqa: UP031
    with pytest.raises(ValidationError, match="not a plain JSON object"):
        RecordSignal.model_validate_json(body)
