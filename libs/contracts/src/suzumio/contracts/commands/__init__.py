"""Commands (imperative, one owning service each) and the request/reply wire models."""

from suzumio.contracts.commands.agents import CreateAgent, DisableAgent, EnableAgent, UpdateAgent
from suzumio.contracts.commands.artifacts import DeleteArtifact, RecordArtifact
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
from suzumio.contracts.commands.pending_actions import (
    AnswerPendingAction,
    CreatePendingAction,
    ExpirePendingAction,
)
from suzumio.contracts.commands.projects import (
    ChangeProjectLimits,
    CreateProject,
    GrantMount,
    RemoveMember,
    RemoveProvider,
    RemoveRuntimeProfile,
    RenameProject,
    RevokeMount,
    SetMember,
    SetProvider,
    SetRuntimeProfile,
)
from suzumio.contracts.commands.scheduler import TakeSignals
from suzumio.contracts.commands.sessions import (
    CloseSession,
    OpenSession,
    PostMessage,
    RecordSignal,
    ReopenSession,
)
from suzumio.contracts.commands.users import (
    BootstrapAdmin,
    CreateApiKey,
    CreateUser,
    RevokeApiKey,
)

__all__ = [
    "COMMAND_TYPES",
    "AnswerPendingAction",
    "BootstrapAdmin",
    "ChangeProjectLimits",
    "CloseSession",
    "Command",
    "CommandAccepted",
    "CommandRejected",
    "CommandReply",
    "CommandRequest",
    "CreateAgent",
    "CreateApiKey",
    "CreatePendingAction",
    "CreateProject",
    "CreateUser",
    "DeleteArtifact",
    "DisableAgent",
    "EnableAgent",
    "EventRef",
    "ExpirePendingAction",
    "GrantMount",
    "OpenSession",
    "PostMessage",
    "RecordArtifact",
    "RecordSignal",
    "RemoveMember",
    "RemoveProvider",
    "RemoveRuntimeProfile",
    "RenameProject",
    "ReopenSession",
    "RevokeApiKey",
    "RevokeMount",
    "SetMember",
    "SetProvider",
    "SetRuntimeProfile",
    "TakeSignals",
    "UpdateAgent",
    "command",
]
