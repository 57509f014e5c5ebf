"""Pending actions: questions, approvals and file requests from running agents."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response

from suzumio.contracts.commands import AnswerPendingAction
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import PendingKind, Role
from suzumio.gateway.api.auth import Principal
from suzumio.gateway.api.deps import GatewayDep, PrincipalDep, ReadPosition, require_role
from suzumio.gateway.api.models import PendingActionOut, ReplyIn
from suzumio.gateway.api.pagination import Page, page_of
from suzumio.gateway.api.problems import not_found
from suzumio.gateway.api.routes.common import RESPONSES, send, settle
from suzumio.gateway.api.routes.sessions import Paging, visible_session
from suzumio.gateway.queries.rows import page_in_log_order
from suzumio.gateway.state import Gateway

router = APIRouter(tags=["pending actions"], responses=RESPONSES)


def _action(row: Any) -> PendingActionOut:
    return PendingActionOut(
        id=row["id"],
        session_id=row["session_id"],
        activation_id=row["activation_id"],
        kind=PendingKind(row["kind"]),
        prompt=row["prompt"],
        options=row["options"],
        paths=row["paths"],
        status=row["status"],
        answer=row["answer"],
        approved=row["approved"],
        artifact_ids=row["artifact_ids"],
        answered_by=row["answered_by"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        closed_at=row["closed_at"],
    )


async def _visible(gw: Gateway, who: Principal, action_id: Identifier, needed: Role) -> Any:
    row = await gw.pool.fetchrow(
        "SELECT * FROM proj_pending_actions.pending_actions WHERE id = $1", action_id
    )
    if row is None:
        raise not_found("pending action")
    await require_role(gw, who, row["project_id"], needed, "pending action")
    return row


@router.get("/v1/sessions/{session_id}/pending-actions")
async def list_pending_actions(
    session_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    _: ReadPosition,
    paging: Paging,
    status: Annotated[Literal["open", "answered", "expired", "cancelled"] | None, Query()] = None,
) -> Page[PendingActionOut]:
    """The session's pending actions in the order the log holds them, a page at a time;
    `status` picks those of one status (`open`: what its agent waits on)."""
    await visible_session(gw, who, session_id, Role.VIEWER)
    where, args = ["session_id = $1"], [session_id]
    if status is not None:
        args.append(status)
        where.append(f"status = ${len(args)}")
    select = "SELECT * FROM proj_pending_actions.pending_actions"
    # The log's order (see the tool calls'), not the writer's clock.
    rows, sort = await page_in_log_order(
        gw.pool, select, where, args, paging, sort="created_position", before="created_at"
    )
    return page_of(rows, paging.limit, sort, _action)


@router.get("/v1/pending-actions/{action_id}")
async def get_pending_action(
    action_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> PendingActionOut:
    return _action(await _visible(gw, who, action_id, Role.VIEWER))


@router.post("/v1/pending-actions/{action_id}/reply")
async def reply(
    action_id: Identifier, body: ReplyIn, gw: GatewayDep, who: PrincipalDep, response: Response
) -> PendingActionOut:
    """Answer a question, approve or refuse, or hand over the requested files: the agent hears
    of it at once (a P1 signal on its session)."""
    await _visible(gw, who, action_id, Role.MEMBER)
    command = AnswerPendingAction(
        pending_action_id=action_id,
        answer=body.answer,
        approved=body.approved,
        artifact_ids=tuple(body.artifact_ids),
    )
    await settle(gw, await send(gw, who, command, response), reads="pending_actions")
    return _action(await _visible(gw, who, action_id, Role.VIEWER))
