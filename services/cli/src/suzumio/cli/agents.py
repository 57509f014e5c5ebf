"""`suzumio agents import DIR`: pack an agent package directory and create the agent from it;
`suzumio agents update ID DIR`: a new version of its package; `suzumio agents create PROJECT
NAME`: an agent from a few options."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated
from urllib.parse import quote, unquote

import typer
from rich.console import Console
from rich.markup import escape

from suzumio.cli import rest
from suzumio.cli.failures import fail, redact

app = typer.Typer(help="Agents, through the REST API.", no_args_is_help=True)
console = Console()


# What the API takes (docs/agent-packages.md): packing stops past it, before a directory
# pointed at by mistake (a home directory, node_modules) is read into memory whole.
MAX_ENTRIES = 2_000
MAX_UNPACKED_BYTES = 100 * 1024 * 1024
# Version control's own data is no part of an agent: left out, as `npm pack` or `docker build`
# with the usual ignore files would.
SKIPPED_DIRECTORIES = frozenset({".git", ".hg", ".svn"})


def pack(directory: Path) -> bytes:
    """The directory as a tar.gz, with paths relative to it; links are refused."""
    buffer = io.BytesIO()
    entries, total = 0, 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in _walk(directory):
            if path.is_symlink():
                raise typer.BadParameter(f"{path} is a symbolic link; packages hold files only")
            if not path.is_file():
                continue
            name = path.relative_to(directory).as_posix()
            try:
                name.encode()
            except UnicodeEncodeError:
                shown = name.encode(errors="surrogateescape").decode(errors="replace")
                raise typer.BadParameter(f"{shown!r}: package file names must be UTF-8") from None
            entries += 1
            total += path.stat().st_size
            if entries > MAX_ENTRIES or total > MAX_UNPACKED_BYTES:
                raise typer.BadParameter(
                    f"{directory} holds more than a package may ({MAX_ENTRIES:,} files, "
                    f"{MAX_UNPACKED_BYTES >> 20} MiB); is it the package's directory?"
                )
            archive.add(path, arcname=name, recursive=False)
    return buffer.getvalue()


def _walk(directory: Path) -> Iterator[Path]:
    """Every path under `directory` in name order, depth first, without descending into
    links or VCS data; lazily, so packing stops at the limits without listing everything."""
    stack = [sorted(directory.iterdir(), reverse=True)]
    while stack:
        if not stack[-1]:
            stack.pop()
            continue
        path = stack[-1].pop()
        if path.is_dir() and not path.is_symlink():
            if path.name not in SKIPPED_DIRECTORIES:
                stack.append(sorted(path.iterdir(), reverse=True))
            continue
        yield path


def _send(api: str, key: str | None, directory: Path, path: str, expect: int, done: str) -> None:
    """POST the package in `directory` to `path`; say which agent it made or changed."""
    headers = rest.key_headers(api, key)
    try:
        archive = pack(directory)
    except OSError as exc:  # a file we may not read, or one gone while packing
        where = f": {exc.filename}" if exc.filename else ""
        fail(f"cannot pack {directory}: {exc.strerror or exc}{where}", code=2)
    files = {"package": (f"{directory.name}.tar.gz", archive, "application/gzip")}
    body, response = rest.post(api, path, expect, made=True, headers=headers, files=files)
    if response.status_code == 504:  # made; the read models are behind (or being rebuilt)
        made = unquote(response.headers["location"].rstrip("/").rsplit("/", 1)[-1])
        rest.errors.print("the agent was made; the API may take a moment to show it", markup=False)
        console.print(f"[green]agent[/green] {done}: {made}")
        return
    if body is None or not {"name", "id"} <= body.keys():
        fail(
            f"the API at {redact(api)} answered {response.status_code} without an agent:"
            f" {rest.short(response)}"
        )
    # The name is the package's, any text: as markup `[beta]` would vanish and `[/x]` crash
    # the command after the agent was made (and a second run make another).
    console.print(f"[green]agent {escape(str(body['name']))}[/green] {done}: {body['id']}")


PackageDir = Annotated[Path, typer.Argument(exists=True, file_okay=False, resolve_path=True)]


@app.command("import")
def import_command(
    directory: PackageDir,
    project: Annotated[str, typer.Option(help="project id")],
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Create an agent from a package directory (agent.yaml, prompt/system.md, ...)."""
    # One path segment whatever it holds: `a/../x` or `x?y` must not name another endpoint.
    path = f"/v1/projects/{quote(project, safe='')}/agents/import"
    _send(api, key, directory, path, 201, "created")


@app.command("update")
def update_command(
    agent_id: Annotated[str, typer.Argument(help="the agent's id")],
    directory: PackageDir,
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Replace an agent's definition with a new version of its package (every setting,
    the prompt, env facts and assets; from its next activation on)."""
    _send(api, key, directory, f"/v1/agents/{quote(agent_id, safe='')}/package", 200, "updated")


@app.command("create")
def create_command(
    project: Annotated[str, typer.Argument(help="the project's id")],
    name: Annotated[str, typer.Argument(help="the agent's name")],
    model: Annotated[str, typer.Option(help="the model's name, as its provider knows it")],
    role: Annotated[str | None, typer.Option(help="its role (default: its name)")] = None,
    prompt: Annotated[str, typer.Option(help="its system prompt")] = "",
    provider: Annotated[
        str | None, typer.Option(help="the project's provider settings (default: the platform's)")
    ] = None,
    runtime_profile: Annotated[
        str | None, typer.Option(help="the project's runtime profile (default: the platform's)")
    ] = None,
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Create an agent with the default tools (files, shell); prints its id. The API, or
    `agents import`, sets everything else: tools, toolpacks, permissions, env facts."""
    spec: dict[str, object] = {"name": model}
    if provider:
        spec["provider"] = provider
    body: dict[str, object] = {"name": name, "role": role or name, "prompt": prompt, "model": spec}
    if runtime_profile:
        body["runtime_profile"] = runtime_profile
    path = f"/v1/projects/{quote(project, safe='')}/agents"
    typer.echo(rest.create(api, path, body, key, "agent"))
