"""`suzumio activations cancel ID`: stop a live activation, through the REST API."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer
from rich.console import Console

from suzumio.cli import rest
from suzumio.cli.failures import fail, redact

app = typer.Typer(help="Activations, through the REST API.", no_args_is_help=True)
console = Console()


@app.command("cancel")
def cancel_command(
    activation_id: Annotated[str, typer.Argument(help="the activation's id")],
    reason: Annotated[str, typer.Option(help="recorded with the cancel")] = "",
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Stop a live activation now: its sandbox is killed, its token fenced."""
    headers = rest.key_headers(api, key)
    # One path segment whatever it holds: `a/../x` or `x?y` must not name another endpoint.
    path = f"/v1/activations/{quote(activation_id, safe='')}/cancel"
    body = {"reason": reason} if reason else None
    answer, response = rest.post(api, path, 202, headers=headers, json=body)
    if answer is None or "status" not in answer:
        fail(f"the API at {redact(api)} answered 202 without an activation: {rest.short(response)}")
    console.print(
        f"cancel requested for {activation_id} (status: {answer['status']})",
        style="green",
        markup=False,
    )
