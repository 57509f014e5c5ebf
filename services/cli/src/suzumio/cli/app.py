"""The `suzumio` command."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer

from suzumio.cli import (
    activations,
    agents,
    pending,
    projections,
    projects,
    secrets,
    sessions,
)
from suzumio.cli.admin import ADMIN_KEY_FILE, AdminUnconfirmedError, KeyFileError, bootstrap_admin
from suzumio.cli.chat import chat_command
from suzumio.cli.connected import Platform, with_platform
from suzumio.cli.failures import fail, load_settings
from suzumio.cli.supervisor import ServiceSpec, Supervisor, url_host
from suzumio.platform.logging import configure_logging
from suzumio.platform.service.unix_socket import MAX_PATH_BYTES

app = typer.Typer(
    help="Suzumio: a control plane for LLM agents.", no_args_is_help=True, add_completion=False
)
app.add_typer(projections.app, name="projections")
app.add_typer(projects.app, name="projects")
app.add_typer(sessions.app, name="sessions")
app.add_typer(pending.app, name="pending")
app.add_typer(agents.app, name="agents")
app.add_typer(activations.app, name="activations")
app.add_typer(secrets.app, name="secrets")
app.command("chat")(chat_command)


@app.callback()
def _configure() -> None:
    settings = load_settings()  # a wrong SUZUMIO_* variable: one line naming it, exit 2
    configure_logging("cli", level=settings.log_level, fmt=settings.log_format)
    # A command's own requests are its output's business, not a log line each (`chat` asks
    # every quarter of a second), unless asked for with SUZUMIO_LOG_LEVEL=debug.
    if settings.log_level != "debug":
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)


MAX_PORT = 65535  # past it an option is a usage error, not a traceback from bind()


@app.command()
def up(
    host: Annotated[str, typer.Option(help="address the HTTP listeners bind to")] = "127.0.0.1",
    api_port: Annotated[
        int, typer.Option(help="gateway: REST API and web page", min=1, max=MAX_PORT)
    ] = 8080,
    broker_port: Annotated[
        int, typer.Option(help="tool-broker: the runners' door", min=1, max=MAX_PORT)
    ] = 8081,
    internal_ports_from: Annotated[
        int,
        typer.Option(
            help="first of four ports: session, scheduler, orchestrator, demo model",
            min=1,
            max=MAX_PORT - 3,
        ),
    ] = 8091,
) -> None:
    """Start the whole platform here: embedded NATS and Postgres unless SUZUMIO_NATS_URL and
    SUZUMIO_DATABASE_URL are set, and the five services. Ctrl-C stops everything."""
    services = [
        ServiceSpec("session", internal_ports_from),
        ServiceSpec("scheduler", internal_ports_from + 1),
        ServiceSpec("orchestrator", internal_ports_from + 2),
        ServiceSpec("toolbroker", broker_port),
        ServiceSpec("gateway", api_port),
    ]
    env = {"SUZUMIO_BROKER_URL": f"http://{_reachable(host)}:{broker_port}"}
    banner: list[str] = []
    if not any(os.environ.get(k) for k in MODEL_SETTINGS):
        # No model configured: the clearly labelled offline demo model answers instead.
        port = internal_ports_from + 3
        services.insert(0, ServiceSpec(
            "demo-model", port, module="suzumio.testing.model_server",
            args=("--demo", "--host", "127.0.0.1", "--port", str(port)), ready_path="/v1/models",
            host="127.0.0.1",  # loopback whatever --host says: only this machine needs it
        ))  # fmt: skip
        env["SUZUMIO_MODEL_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
        banner.append(
            f"model:            OFFLINE DEMO MODEL at http://127.0.0.1:{port}/v1 (no key set;"
            " set SUZUMIO_MODEL_BASE_URL and SUZUMIO_MODEL_API_KEY for a real one)"
        )
    env |= docker_network(host, demo_model=bool(banner), environ=os.environ)
    settings = load_settings()
    env |= broker_socket(settings.data_dir, os.environ)
    supervisor = Supervisor(
        settings, host=host, services=tuple(services), extra_env=env, banner=tuple(banner),
    )  # fmt: skip
    raise typer.Exit(supervisor.run())


def broker_socket(data_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The tool-broker's Unix socket, which sandboxes of network 'none' get bound in (both the
    broker and the orchestrator read the variable): in the data directory, unless
    the environment names one, or the path is longer than a socket's address holds (then
    'none' profiles fail their activations, saying the variable is unset)."""
    if BROKER_SOCKET_SETTING in environ:
        return {}
    path = (data_dir / "run" / "broker.sock").absolute()
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        return {}
    return {BROKER_SOCKET_SETTING: str(path)}


BROKER_SOCKET_SETTING = "SUZUMIO_BROKER_SOCKET"
MODEL_SETTINGS = ("SUZUMIO_MODEL_BASE_URL", "SUZUMIO_MODEL_API_KEY", "OPENAI_API_KEY")


def _reachable(host: str) -> str:
    """Where sandboxes on this machine reach a listener bound to `host`, as a URL's host."""
    return "127.0.0.1" if host in {"0.0.0.0", "::", ""} else url_host(host)  # noqa: S104


def docker_network(host: str, *, demo_model: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """What docker sandboxes join when this machine runs everything. On an engine's bridge a
    sandbox reaches the host through its gateway address, where a listener bound to loopback
    does not answer: with the tool-broker (or the demo model, always on loopback) there, they
    share the host's network instead — its loopback is what they must reach, and the embedded
    servers there take a password. `--host 0.0.0.0` and a real model let them use the bridge;
    a network set in the environment always wins."""
    if NETWORK_SETTING in environ:
        return {}
    # The runner calls the model itself: a model server on loopback (Ollama's default) too.
    model = urlsplit(environ.get("SUZUMIO_MODEL_BASE_URL", "")).hostname or ""
    on_loopback = any(_loopback(h) for h in (host, model))
    return {NETWORK_SETTING: "host"} if on_loopback or demo_model else {}


def _loopback(host: str) -> bool:
    return host in {"localhost", "::1"} or host.startswith("127.")


NETWORK_SETTING = "SUZUMIO_DOCKER__NETWORK_MODE_EGRESS"


@app.command("bootstrap-admin")
def bootstrap_admin_command() -> None:
    """Create the platform's first admin and print its API key (once). `suzumio up` does this
    by itself; use this where the services run elsewhere (Compose, Kubernetes). The key is
    also kept in `<data dir>/admin.key` (mode 0600), saved before the command goes out, so an
    interrupted run loses nothing: running it again sends the same key."""
    data_dir = load_settings().data_dir

    async def run(platform: Platform) -> str | None:
        try:
            return await bootstrap_admin(platform.nc, platform.topology, data_dir)
        except KeyFileError as exc:
            fail(str(exc), code=2)
        except AdminUnconfirmedError as exc:
            # It may still be applied: the key is shown as well as kept.
            typer.echo(
                f"error: {exc}; it may still be applied, and then this is the admin's API key"
                f" (kept in {(data_dir / ADMIN_KEY_FILE).resolve()}; run this again to resend it):",
                err=True,
            )
            print(exc.key)
            raise typer.Exit(1) from None

    key = with_platform(run)
    if key is None:
        print("The platform has an admin already.")
        raise typer.Exit(1)
    print(key)
    typer.echo(f"(also saved in {(data_dir / ADMIN_KEY_FILE).resolve()})", err=True)
