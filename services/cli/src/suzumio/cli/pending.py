"""`suzumio pending list SESSION` and `suzumio pending reply ID`: what agents wait on (a
question, an approval of a tool call, files), and the answer, through the REST API."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.console import Console

from suzumio.cli import rest
from suzumio.cli.failures import fail, redact

app = typer.Typer(help="What agents wait on, and the answers.", no_args_is_help=True)
console = Console(highlight=False, soft_wrap=True)  # one line per line, however narrow


def describe(action: dict[str, Any]) -> str:
    """One line saying what the agent waits on."""
    prompt = " ".join(str(action.get("prompt") or "").split())
    match action.get("kind"):
        case "approval":
            return f"? approve: {prompt}"
        case "artifact_request":
            paths = ", ".join(str(p) for p in action.get("paths") or ())
            return f"? files wanted: {paths}" + (f" ({prompt})" if prompt else "")
    options = action.get("options") or []
    return f"? {prompt}" + (f" [{' / '.join(str(o) for o in options)}]" if options else "")


def how_to_reply(action: dict[str, Any]) -> str:
    ident = action.get("id")
    match action.get("kind"):
        case "approval":
            return f"suzumio pending reply {ident} --approve (or --deny)"
        case "artifact_request":
            return f"POST /v1/pending-actions/{ident}/reply with the artifact_ids"
    return f'suzumio pending reply {ident} --answer "..."'


@app.command("list")
def list_command(
    session_id: Annotated[str, typer.Argument(help="the session's id")],
    every: Annotated[bool, typer.Option("--all", help="answered and expired ones too")] = False,
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """What the session's agent waits on: one line each, with its id and status."""
    path = f"/v1/sessions/{quote(session_id, safe='')}/pending-actions"
    for action in rest.get_list(api, path, key):
        if every or action.get("status") == "open":
            console.print(
                f"{action.get('id')} {action.get('status')} {describe(action)}", markup=False
            )


@app.command("reply")
def reply_command(
    action_id: Annotated[str, typer.Argument(help="the pending action's id")],
    answer: Annotated[str, typer.Option(help="the answer to a question")] = "",
    approved: Annotated[
        bool | None, typer.Option("--approve/--deny", help="the decision on an approval")
    ] = None,
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Answer what an agent waits on; it hears of it at once."""
    if not answer and approved is None:
        fail("say what: --answer TEXT, or --approve / --deny", code=2)
    body: dict[str, object] = {"answer": answer}
    if approved is not None:
        body["approved"] = approved
    path = f"/v1/pending-actions/{quote(action_id, safe='')}/reply"
    done, response = rest.post(api, path, 200, headers=rest.key_headers(api, key), json=body)
    if done is None or "status" not in done:
        fail(f"the API at {redact(api)} answered 200 without the action: {rest.short(response)}")
    console.print(f"{action_id} {done['status']}", style="green", markup=False)
