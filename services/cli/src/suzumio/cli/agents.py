"""`suzumio agents import DIR`: pack an agent package directory and create the agent from it."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from suzumio.cli.failures import fail, first_line, redact
from suzumio.cli.keys import api_key, authorization

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
    try:
        archive = pack(directory)
    except OSError as exc:  # a file we may not read, or one gone while packing
        where = f": {exc.filename}" if exc.filename else ""
        fail(f"cannot pack {directory}: {exc.strerror or exc}{where}", code=2)
    # One path segment whatever it holds: `a/../x` or `x?y` must not name another endpoint.
    url = f"{api.rstrip('/')}/v1/projects/{quote(project, safe='')}/agents/import"
    shown = redact(api)  # as we print it: a proxy's password (https://user:pw@host) masked
    if not api.startswith(("http://", "https://")):
        fail(f"--api {shown!r} needs a scheme, like http://{shown}")
    try:
        response = httpx.post(
            url,
            headers=headers,
            files={"package": (f"{directory.name}.tar.gz", archive, "application/gzip")},
            timeout=60,
        )
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        fail(f"could not reach the API at {shown}: {first_line(exc).replace(api, shown)}")
    body = _json_object(response)
    if response.status_code != 201:
        detail = body.get("detail") if body is not None else None
        text = str(detail) if detail is not None else _short(response)
        text += _field_errors(body)
        console.print(f"{response.status_code}: {text}", style="red", markup=False)
        raise typer.Exit(1)
    if body is None or not {"name", "id"} <= body.keys():
        fail(f"the API at {shown} answered 201 without an agent: {_short(response)}")
    # The name is the package's, any text: as markup `[beta]` would vanish and `[/x]` crash
    # the command after the agent was made (and a second run make another).
    console.print(f"[green]agent {escape(str(body['name']))}[/green] created: {body['id']}")


def _json_object(response: httpx.Response) -> dict[str, object] | None:
    """The body as a JSON object, or None (a proxy's HTML error page, a list, nothing)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _field_errors(body: dict[str, object] | None) -> str:
    """A 422's per-field reasons (`errors` of the problem), which its `detail` only sums up."""
    errors = body.get("errors") if body is not None else None
    if not isinstance(errors, list):
        return ""
    said = [
        f"{e.get('loc')}: {e.get('msg')}" if e.get("loc") else str(e.get("msg"))
        for e in errors
        if isinstance(e, dict)
    ]
    return f" ({'; '.join(said)})" if said else ""


def _short(response: httpx.Response, limit: int = 200) -> str:
    """The body on one line, cut short, so an HTML error page stays one line of output."""
    text = " ".join(response.text.split())
    if not text:
        return response.reason_phrase or "(empty body)"
    return text if len(text) <= limit else text[:limit] + " ..."
