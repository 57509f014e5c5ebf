"""`suzumio activations cancel ID`: stop a live activation, through the REST API."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import httpx
import typer
from rich.console import Console

from suzumio.cli.agents import _field_errors, _json_object, _short
from suzumio.cli.failures import fail, first_line, redact
from suzumio.cli.keys import api_key, authorization

app = typer.Typer(help="Activations, through the REST API.", no_args_is_help=True)
console = Console()


@app.command("cancel")
def cancel_command(
    activation_id: Annotated[str, typer.Argument(help="the activation's id")],
    reason: Annotated[str, typer.Option(help="recorded with the cancel")] = "",
    api: Annotated[str, typer.Option(envvar="SUZUMIO_API_URL")] = "http://127.0.0.1:8080",
    key: Annotated[
        str | None,
        typer.Option(
            help="API key; default: $SUZUMIO_API_KEY, then the data directory's admin key"
        ),
    ] = None,
) -> None:
    """Stop a live activation now: its sandbox is killed, its token fenced."""
    found = api_key(key)
    if found is None:
        console.print("[red]no API key: pass --key or set SUZUMIO_API_KEY[/red]")
        raise typer.Exit(2)
    shown = redact(api)
    if not api.startswith(("http://", "https://")):
        fail(f"--api {shown!r} needs a scheme, like http://{shown}")
    # One path segment whatever it holds: `a/../x` or `x?y` must not name another endpoint.
    url = f"{api.rstrip('/')}/v1/activations/{quote(activation_id, safe='')}/cancel"
    headers = authorization(*found)
    body = {"reason": reason} if reason else None
    try:
        response = httpx.post(url, headers=headers, json=body, timeout=60)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        fail(f"could not reach the API at {shown}: {first_line(exc).replace(api, shown)}")
    answer = _json_object(response)
    if response.status_code != 202:
        detail = answer.get("detail") if answer is not None else None
        text = str(detail) if detail is not None else _short(response)
        text += _field_errors(answer)
        console.print(f"{response.status_code}: {text}", style="red", markup=False)
        raise typer.Exit(1)
    if answer is None or "status" not in answer:
        fail(f"the API at {shown} answered 202 without an activation: {_short(response)}")
    console.print(
        f"cancel requested for {activation_id} (status: {answer['status']})",
        style="green",
        markup=False,
    )
