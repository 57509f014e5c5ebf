"""The command envelope and replies carried over NATS request/reply on `cmd.<service>.<verb>`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from suzumio.contracts.errors import ErrorBody
from suzumio.contracts.ids import new_id


class Command(BaseModel):
    """Base of every command payload. Unknown fields are refused: a typo is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    service: ClassVar[str]
    verb: ClassVar[str]


C = TypeVar("C", bound=Command)
COMMAND_TYPES: dict[tuple[str, str], type[Command]] = {}


def command(service: str, verb: str) -> Callable[[type[C]], type[C]]:
    """Register a command payload class as `cmd.<service>.<verb>`."""

    def register(cls: type[C]) -> type[C]:
        if (service, verb) in COMMAND_TYPES:
            raise ValueError(f"command {service}.{verb} is registered twice")
        cls.service = service
        cls.verb = verb
        COMMAND_TYPES[(service, verb)] = cls
        return cls

    return register


class CommandRequest(BaseModel):
    """What travels to the owning service: the payload and the context of the call."""

    model_config = ConfigDict(frozen=True)

    service: str
    verb: str
    idempotency_key: str = Field(
        default_factory=new_id,
        max_length=200,
        description="the same key within the retention window replays the first reply",
    )
    actor: str
    correlation_id: str = Field(default_factory=new_id)
    data: dict[str, Any]


class EventRef(BaseModel):
    """Where an event a command wrote sits in the log."""

    model_config = ConfigDict(frozen=True)

    id: str
    type: str
    aggregate: str
    aggregate_id: str
    version: int
    seq: int


class CommandAccepted(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: Literal["ok"] = "ok"
    events: tuple[EventRef, ...] = ()
    position: int = Field(
        default=0, description="highest stream sequence written; wait for it to read your writes"
    )
    result: dict[str, Any] = Field(default_factory=dict)


class CommandRejected(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: Literal["error"] = "error"
    error: ErrorBody


CommandReply = Annotated[CommandAccepted | CommandRejected, Field(discriminator="status")]
REPLY_ADAPTER: TypeAdapter[CommandAccepted | CommandRejected] = TypeAdapter(CommandReply)
