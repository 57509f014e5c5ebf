"""`suzumio sessions create PROJECT --agent ID` and `suzumio sessions history ID`, through the
REST API (`suzumio chat` talks in one)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer
from rich.console import Console

from suzumio.cli import rest

app = typer.Typer(help="Sessions, through the REST API.", no_args_is_help=True)
console = Console(highlight=False, soft_wrap=True)  # one line per line, however narrow


@app.command("create")
def create_command(
    project: Annotated[str, typer.Argument(help="the project's id")],
    agent: Annotated[str, typer.Option(help="the agent's id: who answers in the session")],
    title: Annotated[str, typer.Option(help="shown in lists")] = "",
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Open a session with an agent; prints its id."""
    path = f"/v1/projects/{quote(project, safe='')}/sessions"
    typer.echo(rest.create(api, path, {"agent_id": agent, "title": title}, key, "session"))


@app.command("history")
def history_command(
    session_id: Annotated[str, typer.Argument(help="the session's id")],
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Print the session's history, oldest first: one `role: text` line per entry (an
    assistant entry that only called tools has no text: `(no text)`)."""
    path = f"/v1/sessions/{quote(session_id, safe='')}/messages"
    for item in rest.get_list(api, path, key):
        console.print(_entry(item), markup=False)


def _entry(item: dict[str, object]) -> str:
    return f"{item.get('role')}: {item.get('text') or '(no text)'}"
