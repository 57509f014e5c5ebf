"""`suzumio agents import DIR`: pack an agent package directory and create the agent from it."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console

from suzumio.cli.admin import ADMIN_KEY_FILE
from suzumio.platform.settings import PlatformSettings

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


def default_key() -> str | None:
    key = os.environ.get("SUZUMIO_API_KEY")
    if key:
        return key
    path = PlatformSettings().data_dir / ADMIN_KEY_FILE
    return path.read_text().strip() if path.exists() else None


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
    api_key = key or default_key()
    if not api_key:
        console.print("[red]no API key: pass --key or set SUZUMIO_API_KEY[/red]")
        raise typer.Exit(2)
    archive = pack(directory)
    response = httpx.post(
        f"{api.rstrip('/')}/v1/projects/{project}/agents/import",
        headers={"Authorization": f"Bearer {api_key}"},
        files={"package": (f"{directory.name}.tar.gz", archive, "application/gzip")},
        timeout=60,
    )
    if response.status_code != 201:
        detail = response.json().get("detail", response.text) if response.content else ""
        console.print(f"[red]{response.status_code}: {detail}[/red]")
        raise typer.Exit(1)
    agent = response.json()
    console.print(f"[green]agent {agent['name']}[/green] created: {agent['id']}")
