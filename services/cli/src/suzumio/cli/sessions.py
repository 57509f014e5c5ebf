"""`suzumio sessions create PROJECT --agent ID` and `suzumio sessions history ID`, through the
REST API (`suzumio chat` talks in one)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import httpx
import typer
from rich.console import Console

from suzumio.cli import rest
from suzumio.cli.failures import fail, first_line, redact

app = typer.Typer(help="Sessions, through the REST API.", no_args_is_help=True)
console = Console(highlight=False)
PAGE = 200


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
    """Print the session's history, oldest first: one `role: text` entry each (an assistant
    entry that only called tools names them)."""
    headers = rest.key_headers(key)
    path = f"{api.rstrip('/')}/v1/sessions/{quote(session_id, safe='')}/messages"
    cursor: str | None = None
    with httpx.Client(headers=headers, timeout=60) as client:
        while True:
            params: dict[str, str | int] = {"limit": PAGE, **({"cursor": cursor} if cursor else {})}
            try:
                response = client.get(path, params=params)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                fail(f"could not reach the API at {redact(api)}: {first_line(exc)}")
            page = rest.json_object(response)
            if response.status_code != 200 or page is None:
                detail = page.get("detail") if page is not None else None
                said = str(detail) if detail is not None else rest.short(response)
                console.print(f"{response.status_code}: {said}", style="red", markup=False)
                raise typer.Exit(1)
            items = page.get("items")
            for item in items if isinstance(items, list) else ():
                if isinstance(item, dict):
                    console.print(_entry(item), markup=False)
            following = page.get("next_cursor")
            if not isinstance(following, str) or not following:
                return
            cursor = following


def _entry(item: dict[str, object]) -> str:
    text = str(item.get("text") or "")
    calls = item.get("tool_calls")
    if not text and isinstance(calls, list) and calls:
        names = ", ".join(str(c.get("name")) for c in calls if isinstance(c, dict))
        text = f"(calls {names})"
    return f"{item.get('role')}: {text}"
