"""Commands about projects: settings, members, runtime profiles, providers, mount grants."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    Clean,
    EncryptedSecret,
    MountMode,
    Name,
    ProjectLimits,
    ProviderSpec,
    Role,
    RuntimeProfileSpec,
    Slug,
)


@command("session", "create_project")
class CreateProject(Command):
    project_id: Identifier
    name: Name
    limits: ProjectLimits = ProjectLimits()


@command("session", "rename_project")
class RenameProject(Command):
    project_id: Identifier
    name: Name


@command("session", "change_project_limits")
class ChangeProjectLimits(Command):
    project_id: Identifier
    limits: ProjectLimits


@command("session", "set_member")
class SetMember(Command):
    """Add a user to the project, or change their role."""

    project_id: Identifier
    user_id: Identifier
    role: Role


@command("session", "remove_member")
class RemoveMember(Command):
    project_id: Identifier
    user_id: Identifier


@command("session", "check_project_role")
class CheckProjectRole(Command):
    """A user's role in a project as the log has it now (a read; only the platform asks): the
    gateway asks while the projects' read model is frozen, whose tables still show a member
    removed since. Answered with `result = {"role": <role> | null}`."""

    project_id: Identifier
    user_id: Identifier


@command("session", "set_runtime_profile")
class SetRuntimeProfile(Command):
    project_id: Identifier
    name: Slug
    spec: RuntimeProfileSpec


@command("session", "remove_runtime_profile")
class RemoveRuntimeProfile(Command):
    project_id: Identifier
    name: Slug


@command("session", "set_provider")
class SetProvider(Command):
    """The API key inside `spec` is already sealed by the caller; plaintext never travels."""

    project_id: Identifier
    name: Slug
    spec: ProviderSpec
    keep_api_key: bool = Field(
        default=False, description="keep the stored key when `spec` carries none"
    )


@command("session", "reseal_provider_key")
class ResealProviderKey(Command):
    """The provider's API key sealed again with the platform's current secret key (a key
    rotation: `suzumio secrets reseal`). Applied only while the stored key is still
    `previous`: a key set meanwhile is never replaced by an older one. The plaintext never
    travels; the session service cannot (and need not) open either."""

    project_id: Identifier
    name: Slug
    previous: EncryptedSecret
    api_key: EncryptedSecret


@command("session", "remove_provider")
class RemoveProvider(Command):
    project_id: Identifier
    name: Slug


@command("session", "grant_mount")
class GrantMount(Command):
    project_id: Identifier
    grant_id: Identifier
    host_path: Clean = Field(min_length=1, max_length=4_096)
    target: Clean = Field(min_length=1, max_length=1_000)
    mode: MountMode = MountMode.READ_ONLY
    agent_id: Identifier | None = None


@command("session", "revoke_mount")
class RevokeMount(Command):
    project_id: Identifier
    grant_id: Identifier
