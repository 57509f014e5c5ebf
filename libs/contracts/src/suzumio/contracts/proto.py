"""The contracts as data: JSON Schemas and an AsyncAPI document, built from the models.

`make proto` writes `documents()` under `proto/`; a test compares them with the files so the
published contract never drifts from the code. Pure functions: the caller does the writing.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, RootModel

from suzumio.contracts import events as _events  # noqa: F401 - registers every event type
from suzumio.contracts.broker import FinalCall
from suzumio.contracts.commands import COMMAND_TYPES, CommandRequest
from suzumio.contracts.commands.base import REPLY_ADAPTER
from suzumio.contracts.envelope import EVENT_TYPES, EventEnvelope
from suzumio.contracts.live import LiveChunk
from suzumio.contracts.runner import ActivationDispatch, RunnerActivationInput
from suzumio.contracts.scheduling import AgentSchedulingState, HookAction

Document = dict[str, Any]


def _schema(model: type[BaseModel], title: str | None = None) -> Document:
    doc = model.model_json_schema(by_alias=True)
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    if title:
        doc["title"] = title
    return doc


def _event_file(event_type: str) -> str:
    return f"schemas/events/{event_type}.v{EVENT_TYPES[event_type].schema_version}.json"


def _event_union() -> Document:
    variants = [
        {
            "allOf": [{"$ref": "envelope.json"}],
            "properties": {
                "type": {"const": name},
                "schema": {"const": cls.schema_version},
                "data": {"$ref": _event_file(name).removeprefix("schemas/")},
            },
        }
        for name, cls in sorted(EVENT_TYPES.items())
    ]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Event",
        "description": "Any event of the log, discriminated by `type`.",
        "oneOf": variants,
    }


class HookActions(RootModel[list[HookAction]]):
    """What a scheduler hook returns."""


def schemas() -> dict[str, Document]:
    docs: dict[str, Document] = {
        "schemas/envelope.json": _schema(EventEnvelope),
        "schemas/event.json": _event_union(),
        "schemas/command-request.json": _schema(CommandRequest),
        "schemas/command-reply.json": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "CommandReply",
            **REPLY_ADAPTER.json_schema(by_alias=True),
        },
        "schemas/runner/activation-input.json": _schema(RunnerActivationInput),
        # What `POST /activation-output` takes: the output, version 1 alone or 2 with the
        # runner's last history entries and live batch (a final call).
        "schemas/runner/activation-output.json": _schema(FinalCall, title="ActivationOutput"),
        "schemas/runner/activation-dispatch.json": _schema(ActivationDispatch),
        "schemas/live-chunk.json": _schema(LiveChunk),
        "schemas/scheduling/agent-state.json": _schema(AgentSchedulingState),
        "schemas/scheduling/hook-action.json": _schema(HookActions),
    }
    for name, cls in EVENT_TYPES.items():
        docs[_event_file(name)] = _schema(cls, title=name)
    for (service, verb), ccls in COMMAND_TYPES.items():
        docs[f"schemas/commands/{service}.{verb}.json"] = _schema(ccls, title=f"{service}.{verb}")
    return docs


def _contracts_version() -> str:
    try:
        return version("suzumio-contracts")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


def asyncapi() -> Document:
    """An AsyncAPI 3 document of the NATS subjects, with payloads pointing at the schemas."""
    messages: Document = {
        name: {
            "name": name,
            "contentType": "application/json",
            "payload": {"$ref": _event_file(name)},
            "headers": {
                "type": "object",
                "properties": {
                    "Nats-Msg-Id": {"type": "string", "description": "the (first) event's id"},
                    "Suzumio-Type": {"type": "string", "description": "comma-separated types"},
                    "Suzumio-Version": {"type": "string", "description": "the last version"},
                    "traceparent": {"type": "string"},
                },
            },
        }
        for name in sorted(EVENT_TYPES)
    }
    messages["Commit"] = {
        "name": "Commit",
        "contentType": "application/json",
        "summary": "several events of one aggregate appended by one decision, stored together",
        "payload": {"type": "array", "minItems": 2, "items": {"$ref": "schemas/event.json"}},
    }
    messages["LiveChunk"] = {"payload": {"$ref": "schemas/live-chunk.json"}}
    messages["ActivationDispatch"] = {
        "payload": {"$ref": "schemas/runner/activation-dispatch.json"}
    }
    messages["CommandRequest"] = {"payload": {"$ref": "schemas/command-request.json"}}
    messages["CommandReply"] = {"payload": {"$ref": "schemas/command-reply.json"}}
    param = {"description": "an identifier: [A-Za-z0-9][A-Za-z0-9_-]{0,63}"}
    channels: Document = {
        "events": {
            "address": "ev.{aggregate}.{aggregate_id}",
            "description": "Stream EVENTS (file): the log. A message is one event, or a Commit "
            "(a JSON array) of several events of the aggregate appended together; its "
            "Suzumio-Type header lists their types. Appends are conditional on the subject's last "
            "sequence (Nats-Expected-Last-Subject-Sequence).",
            "parameters": {"aggregate": {"description": "aggregate name"}, "aggregate_id": param},
            "messages": {
                n: {"$ref": f"#/components/messages/{n}"} for n in [*sorted(EVENT_TYPES), "Commit"]
            },
        },
        "live": {
            "address": "live.session.{session_id}",
            "description": "Stream LIVE (memory, minutes of retention): live output.",
            "parameters": {"session_id": param},
            "messages": {"LiveChunk": {"$ref": "#/components/messages/LiveChunk"}},
        },
        "activations": {
            "address": "act.{pool}",
            "description": "Stream ACTIVATIONS (work queue): dispatches for warm workers.",
            "parameters": {"pool": {"description": "worker pool name"}},
            "messages": {
                "ActivationDispatch": {"$ref": "#/components/messages/ActivationDispatch"}
            },
        },
        "commands": {
            "address": "cmd.{service}.{verb}",
            "description": "Request/reply to the owning service; see schemas/commands/.",
            "parameters": {
                "service": {"enum": sorted({s for s, _ in COMMAND_TYPES})},
                "verb": {"enum": sorted({v for _, v in COMMAND_TYPES})},
            },
            "messages": {
                "CommandRequest": {"$ref": "#/components/messages/CommandRequest"},
                "CommandReply": {"$ref": "#/components/messages/CommandReply"},
            },
        },
    }
    operations: Document = {
        "appendEvent": {"action": "send", "channel": {"$ref": "#/channels/events"}},
        "consumeEvents": {"action": "receive", "channel": {"$ref": "#/channels/events"}},
        "publishLive": {"action": "send", "channel": {"$ref": "#/channels/live"}},
        "dispatchActivation": {"action": "send", "channel": {"$ref": "#/channels/activations"}},
        "sendCommand": {
            "action": "send",
            "channel": {"$ref": "#/channels/commands"},
            "messages": [{"$ref": "#/channels/commands/messages/CommandRequest"}],
            "reply": {"messages": [{"$ref": "#/channels/commands/messages/CommandReply"}]},
        },
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Suzumio NATS API",
            "version": _contracts_version(),
            "description": "Subjects of the default topology; a namespace prefixes them all.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def documents() -> dict[str, str]:
    """Every file of `proto/`, relative path → text, deterministically formatted."""
    docs = {**schemas(), "asyncapi.json": asyncapi()}
    return {path: json.dumps(doc, indent=2, sort_keys=True) + "\n" for path, doc in docs.items()}
