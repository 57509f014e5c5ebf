"""The project aggregate: name, limits, members, runtime profiles, providers, mount grants."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import ClassVar

from suzumio.contracts.commands import (
    ChangeProjectLimits,
    CreateProject,
    GrantMount,
    RemoveMember,
    RemoveProvider,
    RemoveRuntimeProfile,
    RenameProject,
    ResealProviderKey,
    RevokeMount,
    SetMember,
    SetProvider,
    SetRuntimeProfile,
)
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import (
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    id_taken,
)
from suzumio.contracts.events import (
    MemberAdded,
    MemberRemoved,
    MemberRoleChanged,
    MountGranted,
    MountRevoked,
    ProjectCreated,
    ProjectLimitsChanged,
    ProjectRenamed,
    ProviderRemoved,
    ProviderSet,
    RuntimeProfileRemoved,
    RuntimeProfileSet,
)
from suzumio.contracts.values import (
    NO_NETWORK_BACKENDS,
    NO_NETWORK_REFUSED,
    NetworkProfile,
    ProjectLimits,
    ProviderSpec,
    Role,
    RuntimeProfileSpec,
)
from suzumio.session.domain.state import AggregateState

# Paths inside a sandbox that belong to the platform and cannot be mount targets.
RESERVED_TARGETS = (
    "/activation",
    "/workspace",
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/var",
    "/tmp",  # noqa: S108 - a reserved target, not a place we write
    "/run",
    "/root",
)
MAX_MEMBERS = 1_000


@dataclass(frozen=True)
class Mount:
    grant_id: str
    host_path: str
    target: str
    mode: str
    agent_id: str | None


class ProjectState(AggregateState):
    aggregate: ClassVar[str] = "project"

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.name = ""
        self.owner_id = ""
        self.limits = ProjectLimits()
        self.members: dict[str, Role] = {}
        self.profiles: dict[str, RuntimeProfileSpec] = {}
        self.providers: dict[str, ProviderSpec] = {}
        self.mounts: dict[str, Mount] = {}
        # Revoked grants' ids stay taken: a retried grant (the same idempotency key) must not
        # bring back a grant an admin revoked since.
        self.revoked_mounts: set[str] = set()

    def apply(self, data: DomainEvent) -> None:  # noqa: C901
        match data:
            case ProjectCreated():
                self.name, self.owner_id, self.limits = data.name, data.owner_id, data.limits
                self.members[data.owner_id] = Role.OWNER
            case ProjectRenamed():
                self.name = data.name
            case ProjectLimitsChanged():
                self.limits = data.limits
            case MemberAdded() | MemberRoleChanged():
                self.members[data.user_id] = data.role
            case MemberRemoved():
                self.members.pop(data.user_id, None)
            case RuntimeProfileSet():
                self.profiles[data.name] = data.spec
            case RuntimeProfileRemoved():
                self.profiles.pop(data.name, None)
            case ProviderSet():
                self.providers[data.name] = data.spec
            case ProviderRemoved():
                self.providers.pop(data.name, None)
            case MountGranted():
                self.mounts[data.grant_id] = Mount(
                    data.grant_id, data.host_path, data.target, data.mode.value, data.agent_id
                )
            case MountRevoked():
                self.mounts.pop(data.grant_id, None)
                self.revoked_mounts.add(data.grant_id)

    @property
    def owners(self) -> set[str]:
        return {uid for uid, role in self.members.items() if role is Role.OWNER}


def create(state: ProjectState, cmd: CreateProject, owner_id: str) -> list[DomainEvent]:
    if state.exists:
        raise id_taken("a project")
    return [ProjectCreated(name=cmd.name, owner_id=owner_id, limits=cmd.limits)]


def rename(state: ProjectState, cmd: RenameProject) -> list[DomainEvent]:
    return [] if cmd.name == state.name else [ProjectRenamed(name=cmd.name)]


def change_limits(state: ProjectState, cmd: ChangeProjectLimits) -> list[DomainEvent]:
    return [] if cmd.limits == state.limits else [ProjectLimitsChanged(limits=cmd.limits)]


def set_member(state: ProjectState, cmd: SetMember, actor_role: Role) -> list[DomainEvent]:
    current = state.members.get(cmd.user_id)
    if Role.OWNER in (cmd.role, current) and actor_role is not Role.OWNER:
        raise ForbiddenError("only an owner may make or unmake owners")  # a role: 403
    if current == cmd.role:
        return []
    if current is Role.OWNER and state.owners == {cmd.user_id}:
        raise ConflictError("the last owner cannot step down; make someone else owner first")
    if current is None:
        if len(state.members) >= MAX_MEMBERS:
            raise ConflictError(f"a project has at most {MAX_MEMBERS} members")
        return [MemberAdded(user_id=cmd.user_id, role=cmd.role)]
    return [MemberRoleChanged(user_id=cmd.user_id, role=cmd.role)]


def remove_member(state: ProjectState, cmd: RemoveMember, actor_role: Role) -> list[DomainEvent]:
    current = state.members.get(cmd.user_id)
    if current is None:
        raise NotFoundError("member not found")
    if current is Role.OWNER:
        if actor_role is not Role.OWNER:
            raise ForbiddenError("only an owner may remove an owner")
        if state.owners == {cmd.user_id}:
            raise ConflictError("the last owner cannot be removed")
    return [MemberRemoved(user_id=cmd.user_id)]


def set_profile(state: ProjectState, cmd: SetRuntimeProfile) -> list[DomainEvent]:
    spec = cmd.spec
    if spec.backend.value in {"docker", "kubernetes"} and not spec.image:
        raise InvalidError(f"a {spec.backend.value} runtime profile needs an image")
    if spec.backend.value == "pool" and not spec.pool:
        raise InvalidError("a pool runtime profile needs the pool's name")
    if spec.network is NetworkProfile.NONE and spec.backend not in NO_NETWORK_BACKENDS:
        raise InvalidError(NO_NETWORK_REFUSED)
    if state.profiles.get(cmd.name) == spec:
        return []
    return [RuntimeProfileSet(name=cmd.name, spec=spec)]


def remove_profile(state: ProjectState, cmd: RemoveRuntimeProfile) -> list[DomainEvent]:
    if cmd.name not in state.profiles:
        raise NotFoundError("runtime profile not found")
    return [RuntimeProfileRemoved(name=cmd.name)]


# The runner speaks the OpenAI API only (docs/runner.md): a provider of another kind would be
# called as if it were OpenAI-compatible (failing at its first model call), so it is refused here.
UNSUPPORTED_PROVIDER_KINDS = {
    "anthropic": "provider kind 'anthropic' is not supported yet (the Anthropic SDK is not wired"
    " into the runner): use kind 'openai' with an OpenAI-compatible endpoint",
}


def set_provider(state: ProjectState, cmd: SetProvider) -> list[DomainEvent]:
    spec = cmd.spec
    if spec.kind in UNSUPPORTED_PROVIDER_KINDS:
        raise InvalidError(UNSUPPORTED_PROVIDER_KINDS[spec.kind])
    stored = state.providers.get(cmd.name)
    if cmd.keep_api_key and spec.api_key is None and stored is not None:
        spec = spec.model_copy(update={"api_key": stored.api_key})
    if stored == spec:
        return []
    return [ProviderSet(name=cmd.name, spec=spec)]


def reseal_provider_key(state: ProjectState, cmd: ResealProviderKey) -> list[DomainEvent]:
    stored = state.providers.get(cmd.name)
    if stored is None:
        raise NotFoundError("provider not found")
    if stored.api_key == cmd.api_key:
        return []  # applied already: a retry of the same reseal
    if stored.api_key != cmd.previous:
        # Set (or removed) since it was read: resealing the old key would bring it back.
        raise ConflictError("the provider's key changed since it was read; read it again")
    return [ProviderSet(name=cmd.name, spec=stored.model_copy(update={"api_key": cmd.api_key}))]


def remove_provider(state: ProjectState, cmd: RemoveProvider) -> list[DomainEvent]:
    if cmd.name not in state.providers:
        raise NotFoundError("provider not found")
    return [ProviderRemoved(name=cmd.name)]


def normalised_target(target: str) -> str:
    """The mount target as an absolute, normalised path, or InvalidError."""
    if not target.startswith("/"):
        raise InvalidError("a mount target must be an absolute path inside the sandbox")
    # normpath keeps a leading "//" (POSIX allows it a meaning); container runtimes do not.
    norm = posixpath.normpath("/" + target.lstrip("/"))
    if norm == "/" or any(norm == r or norm.startswith(r + "/") for r in RESERVED_TARGETS):
        raise InvalidError(f"mount target {norm} is reserved")
    return norm


def grant_mount(
    state: ProjectState, cmd: GrantMount, canonical_host_path: str
) -> list[DomainEvent]:
    if cmd.grant_id in state.mounts:
        raise id_taken("a mount grant")
    if cmd.grant_id in state.revoked_mounts:
        raise ConflictError("a mount grant with this id was revoked: a new grant takes a new id")
    target = normalised_target(cmd.target)
    for mount in state.mounts.values():
        shared = None in (mount.agent_id, cmd.agent_id) or mount.agent_id == cmd.agent_id
        if mount.target == target and shared:  # one agent would get two mounts on one path
            raise ConflictError(f"{target} is already the target of grant {mount.grant_id}")
    return [
        MountGranted(
            grant_id=cmd.grant_id,
            host_path=canonical_host_path,
            target=target,
            mode=cmd.mode,
            agent_id=cmd.agent_id,
        )
    ]


def revoke_mount(state: ProjectState, cmd: RevokeMount) -> list[DomainEvent]:
    if cmd.grant_id not in state.mounts:
        raise NotFoundError("mount grant not found")
    return [MountRevoked(grant_id=cmd.grant_id)]
