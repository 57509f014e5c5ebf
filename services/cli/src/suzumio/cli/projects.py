"""`suzumio projects create NAME`: a project, through the REST API."""

from __future__ import annotations

from typing import Annotated

import typer

from suzumio.cli import rest

app = typer.Typer(help="Projects, through the REST API.", no_args_is_help=True)


@app.command("create")
def create_command(
    name: Annotated[str, typer.Argument(help="the project's name")],
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Create a project owned by the key's user; prints its id (P=$(suzumio projects create x))."""
    typer.echo(rest.create(api, "/v1/projects", {"name": name}, key, "project"))
