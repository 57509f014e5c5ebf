"""Commands (imperative, one owning service each) and the request/reply wire models."""

from suzumio.contracts.commands.base import (
    COMMAND_TYPES,
    Command,
    CommandAccepted,
    CommandRejected,
    CommandReply,
    CommandRequest,
    EventRef,
    command,
)
from suzumio.contracts.commands.session import (
    ChangeProjectLimits,
    CloseSession,
    CreateAgent,
    CreateProject,
    DisableAgent,
    OpenSession,
    PostMessage,
    RenameProject,
    ReopenSession,
    UpdateAgent,
)

__all__ = [
    "COMMAND_TYPES",
    "ChangeProjectLimits",
    "CloseSession",
    "Command",
    "CommandAccepted",
    "CommandRejected",
    "CommandReply",
    "CommandRequest",
    "CreateAgent",
    "CreateProject",
    "DisableAgent",
    "EventRef",
    "OpenSession",
    "PostMessage",
    "RenameProject",
    "ReopenSession",
    "UpdateAgent",
    "command",
]
