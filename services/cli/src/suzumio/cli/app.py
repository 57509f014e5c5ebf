"""The `suzumio` command."""

from __future__ import annotations

from typing import Annotated

import typer

from suzumio.cli import agents, projections
from suzumio.cli.admin import bootstrap_admin
from suzumio.cli.connected import Platform, with_platform
from suzumio.cli.supervisor import ServiceSpec, Supervisor
from suzumio.platform.logging import configure_logging
from suzumio.platform.settings import PlatformSettings

app = typer.Typer(
    help="Suzumio: a control plane for LLM agents.", no_args_is_help=True, add_completion=False
)
app.add_typer(projections.app, name="projections")
app.add_typer(agents.app, name="agents")


@app.callback()
def _configure() -> None:
    settings = PlatformSettings()
    configure_logging("cli", level=settings.log_level, fmt=settings.log_format)


@app.command()
def up(
    host: Annotated[str, typer.Option(help="address the HTTP listeners bind to")] = "127.0.0.1",
    api_port: Annotated[int, typer.Option(help="gateway: REST API and web page")] = 8080,
    broker_port: Annotated[int, typer.Option(help="tool-broker: the runners' door")] = 8081,
    internal_ports_from: Annotated[
        int, typer.Option(help="first of three ports for session, scheduler, orchestrator")
    ] = 8091,
) -> None:
    """Start the whole platform here: embedded NATS and Postgres unless SUZUMIO_NATS_URL and
    SUZUMIO_DATABASE_URL are set, and the five services. Ctrl-C stops everything."""
    services = (
        ServiceSpec("session", internal_ports_from),
        ServiceSpec("scheduler", internal_ports_from + 1),
        ServiceSpec("orchestrator", internal_ports_from + 2),
        ServiceSpec("toolbroker", broker_port),
        ServiceSpec("gateway", api_port),
    )
    raise typer.Exit(Supervisor(PlatformSettings(), host=host, services=services).run())


@app.command("bootstrap-admin")
def bootstrap_admin_command() -> None:
    """Create the platform's first admin and print its API key (once). `suzumio up` does this
    by itself; use this where the services run elsewhere (Compose, Kubernetes)."""

    async def run(platform: Platform) -> str | None:
        return await bootstrap_admin(platform.nc, platform.topology, None)

    key = with_platform(run)
    if key is None:
        print("The platform has an admin already.")
        raise typer.Exit(1)
    print(key)
