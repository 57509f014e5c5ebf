"""The closed set of event types. Importing this package registers all of them."""

from suzumio.contracts.events.activation import (
    ActivationCancelled,
    ActivationCompleted,
    ActivationFailed,
    ActivationStarted,
    ActivationTimedOut,
)
from suzumio.contracts.events.agent import AgentCreated, AgentDisabled, AgentUpdated
from suzumio.contracts.events.consumer import MessageParked
from suzumio.contracts.events.project import (
    ProjectCreated,
    ProjectLimitsChanged,
    ProjectRenamed,
)
from suzumio.contracts.events.session import (
    ActivationCancelRequested,
    ActivationRequested,
    SessionClosed,
    SessionMessageAppended,
    SessionOpened,
    SessionReopened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
)

__all__ = [
    "ActivationCancelRequested",
    "ActivationCancelled",
    "ActivationCompleted",
    "ActivationFailed",
    "ActivationRequested",
    "ActivationStarted",
    "ActivationTimedOut",
    "AgentCreated",
    "AgentDisabled",
    "AgentUpdated",
    "MessageParked",
    "ProjectCreated",
    "ProjectLimitsChanged",
    "ProjectRenamed",
    "SessionClosed",
    "SessionMessageAppended",
    "SessionOpened",
    "SessionReopened",
    "SignalClosed",
    "SignalRecorded",
    "SignalsDelivered",
]
