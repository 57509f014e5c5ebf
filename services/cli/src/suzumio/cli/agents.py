"""`suzumio agents import DIR`: pack an agent package directory and create the agent from it."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console

from suzumio.cli.failures import fail, first_line
from suzumio.cli.keys import api_key, authorization

app = typer.Typer(help="Agents, through the REST API.", no_args_is_help=True)
console = Console()


def pack(directory: Path) -> bytes:
    """The directory as a tar.gz, with paths relative to it; links are refused."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_symlink():
                raise typer.BadParameter(f"{path} is a symbolic link; packages hold files only")
            if path.is_file():
                archive.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    return buffer.getvalue()


@app.command("import")
def import_command(
    directory: Annotated[Path, typer.Argument(exists=True, file_okay=False, resolve_path=True)],
    project: Annotated[str, typer.Option(help="project id")],
    api: Annotated[str, typer.Option(envvar="SUZUMIO_API_URL")] = "http://127.0.0.1:8080",
    key: Annotated[
        str | None,
        typer.Option(
            help="API key; default: $SUZUMIO_API_KEY, then the data directory's admin key"
        ),
    ] = None,
) -> None:
    """Create an agent from a package directory (agent.yaml, prompt/system.md, ...)."""
    found = api_key(key)
    if found is None:
        console.print("[red]no API key: pass --key or set SUZUMIO_API_KEY[/red]")
        raise typer.Exit(2)
    headers = authorization(*found)
    archive = pack(directory)
    url = f"{api.rstrip('/')}/v1/projects/{project}/agents/import"
    if not api.startswith(("http://", "https://")):
        fail(f"--api {api!r} needs a scheme, like http://{api}")
    try:
        response = httpx.post(
            url,
            headers=headers,
            files={"package": (f"{directory.name}.tar.gz", archive, "application/gzip")},
            timeout=60,
        )
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        fail(f"could not reach the API at {api}: {first_line(exc)}")
    body = _json_object(response)
    if response.status_code != 201:
        detail = body.get("detail") if body is not None else None
        text = str(detail) if detail is not None else _short(response)
        console.print(f"{response.status_code}: {text}", style="red", markup=False)
        raise typer.Exit(1)
    if body is None or not {"name", "id"} <= body.keys():
        fail(f"the API at {api} answered 201 without an agent: {_short(response)}")
    console.print(f"[green]agent {body['name']}[/green] created: {body['id']}")


def _json_object(response: httpx.Response) -> dict[str, object] | None:
    """The body as a JSON object, or None (a proxy's HTML error page, a list, nothing)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _short(response: httpx.Response, limit: int = 200) -> str:
    """The body on one line, cut short, so an HTML error page stays one line of output."""
    text = " ".join(response.text.split())
    if not text:
        return response.reason_phrase or "(empty body)"
    return text if len(text) <= limit else text[:limit] + " ..."
