"""The command table of the session service: every `cmd.session.<verb>` it answers."""

from __future__ import annotations

from suzumio.contracts import commands as c
from suzumio.platform.bus.commands import CommandRouter
from suzumio.session.handlers.agents import AgentHandlers
from suzumio.session.handlers.artifacts import ArtifactHandlers
from suzumio.session.handlers.base import Context
from suzumio.session.handlers.pending_actions import PendingActionHandlers
from suzumio.session.handlers.projects import ProjectHandlers
from suzumio.session.handlers.sessions import SessionHandlers
from suzumio.session.handlers.users import UserHandlers


def build_router(context: Context) -> CommandRouter:
    users, projects = UserHandlers(context), ProjectHandlers(context)
    agents, sessions = AgentHandlers(context), SessionHandlers(context)
    artifacts, pending = ArtifactHandlers(context), PendingActionHandlers(context)
    router = CommandRouter("session")
    routes = [
        (c.BootstrapAdmin, users.bootstrap_admin),
        (c.CreateUser, users.create_user),
        (c.CreateApiKey, users.create_api_key),
        (c.RevokeApiKey, users.revoke_api_key),
        (c.CheckApiKey, users.check_api_key),
        (c.CreateProject, projects.create_project),
        (c.RenameProject, projects.rename_project),
        (c.ChangeProjectLimits, projects.change_limits),
        (c.SetMember, projects.set_member),
        (c.RemoveMember, projects.remove_member),
        (c.CheckProjectRole, projects.check_role),
        (c.SetRuntimeProfile, projects.set_profile),
        (c.RemoveRuntimeProfile, projects.remove_profile),
        (c.SetProvider, projects.set_provider),
        (c.RemoveProvider, projects.remove_provider),
        (c.ResealProviderKey, projects.reseal_provider_key),
        (c.GrantMount, projects.grant_mount),
        (c.RevokeMount, projects.revoke_mount),
        (c.CreateAgent, agents.create_agent),
        (c.UpdateAgent, agents.update_agent),
        (c.DisableAgent, agents.disable_agent),
        (c.EnableAgent, agents.enable_agent),
        (c.OpenSession, sessions.open_session),
        (c.CloseSession, sessions.close_session),
        (c.ReopenSession, sessions.reopen_session),
        (c.PostMessage, sessions.post_message),
        (c.RecordSignal, sessions.record_signal),
        (c.AppendHistory, sessions.append_history),
        (c.CompactHistory, sessions.compact_history),
        (c.SaveCheckpoint, sessions.save_checkpoint),
        (c.RecordArtifact, artifacts.record_artifact),
        (c.DeleteArtifact, artifacts.delete_artifact),
        (c.CreatePendingAction, pending.create),
        (c.AnswerPendingAction, pending.answer),
        (c.ExpirePendingAction, pending.expire),
    ]
    for command_type, handler in routes:
        router.register(command_type, handler)  # type: ignore[arg-type]
    return router
