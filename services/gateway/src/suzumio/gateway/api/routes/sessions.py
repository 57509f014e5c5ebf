"""Sessions: their history (messages), signals and activations."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response, status

from suzumio.contracts.commands import (
    CancelActivation,
    CloseSession,
    OpenSession,
    PostMessage,
    RecordSignal,
    ReopenSession,
)
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import Priority, Role
from suzumio.gateway.api.auth import Principal
from suzumio.gateway.api.deps import (
    GatewayDep,
    MintDep,
    PrincipalDep,
    ReadPosition,
    judge,
    require_role,
    role_as_the_log_has_it,
    written,
)
from suzumio.gateway.api.models import (
    ActivationOut,
    Author,
    CancelIn,
    CloseIn,
    MessageIn,
    MessageOut,
    MessagePosted,
    SessionIn,
    SessionOut,
    SignalIn,
    SignalOut,
    ToolCallOut,
)
from suzumio.gateway.api.pagination import Page, PageRequest, page_of, page_request
from suzumio.gateway.api.problems import ApiError, not_found
from suzumio.gateway.api.routes.common import RESPONSES, earlier_attempt, send, settle
from suzumio.gateway.queries.rows import page, page_in_log_order
from suzumio.gateway.state import Gateway

router = APIRouter(tags=["sessions"], responses=RESPONSES)
Paging = Annotated[PageRequest, Depends(page_request)]


def _session(row: Any) -> SessionOut:
    return SessionOut(
        id=row["id"],
        project_id=row["project_id"],
        agent_id=row["agent_id"],
        title=row["title"],
        status=row["status"],
        message_count=row["message_count"],
        last_message_at=row["last_message_at"],
        opened_at=row["opened_at"],
        closed_at=row["closed_at"],
    )


async def _read(gw: Gateway, session_id: Identifier) -> Any:
    row = await gw.pool.fetchrow("SELECT * FROM proj_sessions.sessions WHERE id = $1", session_id)
    if row is None:
        raise not_found("session")
    return row


async def visible_session(gw: Gateway, who: Principal, session_id: Identifier, needed: Role) -> Any:
    """The session's row if the caller may see it with `needed`; 404 when not visible.
    One query: this guards every session route, message posts among them."""
    row = await gw.pool.fetchrow(
        "SELECT s.*, m.role AS caller_role FROM proj_sessions.sessions s"
        " LEFT JOIN proj_projects.members m ON m.project_id = s.project_id AND m.user_id = $2"
        " WHERE s.id = $1",
        session_id,
        who.user_id,
    )
    if row is None:
        raise not_found("session")
    role = Role.OWNER if who.admin else (Role(row["caller_role"]) if row["caller_role"] else None)
    judge(await role_as_the_log_has_it(gw, who, row["project_id"], role), needed, "session")
    return row


@router.post("/v1/projects/{project_id}/sessions", status_code=status.HTTP_201_CREATED)
async def open_session(
    project_id: Identifier,
    body: SessionIn,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    ids: MintDep,
) -> SessionOut:
    """Open a conversation with one of the project's agents."""
    await require_role(gw, who, project_id, Role.MEMBER, "project")
    owner = await gw.pool.fetchval(
        "SELECT project_id FROM proj_agents.agents WHERE id = $1", body.agent_id
    )
    if owner != project_id:
        raise not_found("agent")
    session_id = ids("session")
    command = OpenSession(session_id=session_id, agent_id=body.agent_id, title=body.title)
    location = f"/v1/sessions/{session_id}"
    try:
        reply = await send(gw, who, command, response)
        await settle(gw, reply, reads="sessions", location=location)
    except ConflictError as refused:
        row = await earlier_attempt(
            gw, refused, ids.keyed, "sessions",
            "SELECT * FROM proj_sessions.sessions WHERE id = $1", session_id,
            same=lambda r: (r["agent_id"], r["title"]) == (body.agent_id, body.title),
        )  # fmt: skip
        written(response, int(row["position"]))
    response.headers["Location"] = location
    return _session(await _read(gw, session_id))


@router.get("/v1/projects/{project_id}/sessions")
async def list_sessions(
    project_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    _: ReadPosition,
    paging: Paging,
    agent_id: Annotated[Identifier | None, Query()] = None,
    status_: Annotated[Literal["active", "closed"] | None, Query(alias="status")] = None,
) -> Page[SessionOut]:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    where, args = ["project_id = $1"], [project_id]
    if agent_id is not None:
        args.append(agent_id)
        where.append(f"agent_id = ${len(args)}")
    if status_ is not None:
        args.append(status_)
        where.append(f"status = ${len(args)}")
    select = "SELECT *, opened_at AS created_at FROM proj_sessions.sessions"
    rows = await page(gw.pool, select, where, args, paging)
    return page_of(rows, paging.limit, "created_at", _session)


@router.get("/v1/sessions/{session_id}")
async def get_session(
    session_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> SessionOut:
    return _session(await visible_session(gw, who, session_id, Role.VIEWER))


@router.post("/v1/sessions/{session_id}/close")
async def close_session(
    session_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    body: CloseIn | None = None,
) -> SessionOut:
    """Archive the session: history stays readable, new writes are refused until reopened.
    The body (a `reason`) may be left out."""
    await visible_session(gw, who, session_id, Role.MEMBER)
    reason = body.reason if body is not None else ""
    reply = await send(gw, who, CloseSession(session_id=session_id, reason=reason), response)
    await settle(gw, reply, reads="sessions")
    return _session(await _read(gw, session_id))


@router.post("/v1/sessions/{session_id}/reopen")
async def reopen_session(
    session_id: Identifier, gw: GatewayDep, who: PrincipalDep, response: Response
) -> SessionOut:
    await visible_session(gw, who, session_id, Role.MEMBER)
    reply = await send(gw, who, ReopenSession(session_id=session_id), response)
    await settle(gw, reply, reads="sessions")
    return _session(await _read(gw, session_id))


# -- messages (the session's history) ---------------------------------------------------------
def _message(row: Any) -> MessageOut:
    return MessageOut(
        id=row["message_id"],
        session_id=row["session_id"],
        version=row["version"],
        author=Author(kind=row["author_kind"], id=row["author_id"]),
        role=row["role"],
        text=row["text"],
        created_at=row["created_at"],
    )


@router.get("/v1/sessions/{session_id}/messages")
async def list_messages(
    session_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition, paging: Paging
) -> Page[MessageOut]:
    """The session's history, oldest first."""
    await visible_session(gw, who, session_id, Role.VIEWER)
    select = "SELECT *, message_id AS id FROM proj_sessions.messages"
    rows = await page(
        gw.pool, select, ["session_id = $1"], [session_id], paging, sort="version", descending=False
    )
    return page_of(rows, paging.limit, "version", _message)


@router.post("/v1/sessions/{session_id}/messages", status_code=status.HTTP_201_CREATED)
async def post_message(
    session_id: Identifier,
    body: MessageIn,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    ids: MintDep,
) -> MessagePosted:
    """Send the session's agent a message; it becomes a signal (P1 unless `priority` is set).
    Answers as soon as the message is in the log: pass `position` as `min_position` to read
    it back."""
    await visible_session(gw, who, session_id, Role.MEMBER)
    message_id, signal_id = ids("message"), ids("signal")
    command = PostMessage(
        session_id=session_id,
        message_id=message_id,
        signal_id=signal_id,
        text=body.text,
        priority=body.priority,
    )
    try:
        position = (await send(gw, who, command, response)).position
    except ConflictError as refused:
        row = await earlier_attempt(
            gw, refused, ids.keyed, "sessions",
            "SELECT text, position FROM proj_sessions.messages"
            " WHERE session_id = $1 AND message_id = $2", session_id, message_id,
            same=lambda r: r["text"] == body.text,
        )  # fmt: skip
        position = int(row["position"])
        written(response, position)
    return MessagePosted(
        message_id=message_id, signal_id=signal_id, session_id=session_id, position=position
    )


# -- signals ----------------------------------------------------------------------------
def _signal(row: Any) -> SignalOut:
    return SignalOut(
        id=row["id"],
        session_id=row["session_id"],
        agent_id=row["agent_id"],
        kind=row["kind"],
        priority=Priority(row["priority"]),
        status=row["status"],
        payload=row["payload"],
        message_id=row["message_id"],
        not_before=row["not_before"],
        activation_id=row["activation_id"],
        reason=row["reason"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


@router.get("/v1/sessions/{session_id}/signals")
async def list_signals(
    session_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    _: ReadPosition,
    paging: Paging,
    status_: Annotated[
        Literal["pending", "delivered", "done", "failed", "cancelled"] | None,
        Query(alias="status"),
    ] = None,
) -> Page[SignalOut]:
    await visible_session(gw, who, session_id, Role.VIEWER)
    where, args = ["session_id = $1"], [session_id]
    if status_ is not None:
        args.append(status_)
        where.append(f"status = ${len(args)}")
    rows = await page(gw.pool, "SELECT * FROM proj_signals.signals", where, args, paging)
    return page_of(rows, paging.limit, "created_at", _signal)


@router.post("/v1/sessions/{session_id}/signals", status_code=status.HTTP_201_CREATED)
async def record_signal(
    session_id: Identifier,
    body: SignalIn,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    ids: MintDep,
) -> SignalOut:
    """Record pending work for the session's agent that is not a message (custom work,
    timers with `not_before`)."""
    await visible_session(gw, who, session_id, Role.MEMBER)
    signal_id = ids("signal")
    command = RecordSignal(
        session_id=session_id,
        signal_id=signal_id,
        kind=body.kind,
        priority=body.priority,
        payload=body.payload,
        not_before=body.not_before,
    )
    await settle(gw, await send(gw, who, command, response), reads="signals")
    row = await gw.pool.fetchrow(
        "SELECT * FROM proj_signals.signals WHERE session_id = $1 AND id = $2",
        session_id,
        signal_id,
    )
    if row is None:
        raise not_found("signal")
    return _signal(row)


# -- activations --------------------------------------------------------------------------
def _activation(row: Any) -> ActivationOut:
    return ActivationOut(
        id=row["id"],
        session_id=row["session_id"],
        agent_id=row["agent_id"],
        status=row["status"],
        reason=row["reason"],
        attempt=row["attempt"],
        signal_ids=row["signal_ids"],
        cancel_requested=row["cancel_requested"],
        backend=row["backend"],
        exit_code=row["exit_code"],
        output_text=row["output_text"],
        usage=row["usage"],
        end_reason=row["end_reason"],
        requested_at=row["requested_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
    )


@router.get("/v1/sessions/{session_id}/activations", tags=["activations"])
async def list_activations(
    session_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition, paging: Paging
) -> Page[ActivationOut]:
    await visible_session(gw, who, session_id, Role.VIEWER)
    rows = await page(
        gw.pool,
        "SELECT * FROM proj_activations.activations",
        ["session_id = $1"],
        [session_id],
        paging,
        sort="requested_at",
    )
    return page_of(rows, paging.limit, "requested_at", _activation)


async def _visible_activation(
    gw: Gateway, who: Principal, activation_id: Identifier, needed: Role = Role.VIEWER
) -> Any:
    """The activation's row (with its session's project, `owner`) if the caller may see it
    with `needed`; 404 when not visible, as for a missing one."""
    row = await gw.pool.fetchrow(
        "SELECT a.*, s.project_id AS owner FROM proj_activations.activations a"
        " JOIN proj_sessions.sessions s ON s.id = a.session_id WHERE a.id = $1",
        activation_id,
    )
    if row is None:
        raise not_found("activation")
    await require_role(gw, who, row["owner"], needed, "activation")
    return row


@router.get("/v1/activations/{activation_id}", tags=["activations"])
async def get_activation(
    activation_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> ActivationOut:
    return _activation(await _visible_activation(gw, who, activation_id))


ENDED = frozenset({"completed", "failed", "cancelled", "timed_out"})


@router.post(
    "/v1/activations/{activation_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    tags=["activations"],
)
async def cancel_activation(
    activation_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    body: CancelIn | None = None,
) -> ActivationOut:
    """Stop a live activation now: its sandbox is killed and its token stops working at once
    (DESIGN.md §7); it ends `cancelled` shortly after (202: watch `status`). A member of the
    project may. Cancelling again while that cancel is on its way changes nothing (202); an
    activation that has already ended answers 409."""
    row = await _visible_activation(gw, who, activation_id, Role.MEMBER)
    if row["status"] in ENDED:
        raise ApiError(409, f"the activation has already ended ({row['status']})")
    command = CancelActivation(
        activation_id=activation_id,
        project_id=row["owner"],
        reason=body.reason if body is not None else "",
    )
    await settle(gw, await send(gw, who, command, response), reads="activations")
    return _activation(await _visible_activation(gw, who, activation_id))


@router.get("/v1/activations/{activation_id}/tool-calls", tags=["activations"])
async def list_tool_calls(
    activation_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition, paging: Paging
) -> Page[ToolCallOut]:
    """The audit record of every tool call the activation made, in the order the log holds
    their starts, a page at a time: an activation may make tens of thousands."""
    await _visible_activation(gw, who, activation_id)
    rows, sort = await page_in_log_order(
        gw.pool,
        "SELECT *, call_id AS id FROM proj_tool_calls.tool_calls",
        ["activation_id = $1"],
        [activation_id],
        paging,
        # The log's order, which a call started later never comes before: by the writer's
        # clock (another replica's, or a commit retried after a timeout), a call could sort
        # before a page already read, and never be seen.
        sort="started_position",
        before="started_at",
    )
    return page_of(rows, paging.limit, sort, _tool_call)


def _tool_call(row: Any) -> ToolCallOut:
    return ToolCallOut.model_validate({k: v for k, v in dict(row).items() if k != "id"})
