"""`suzumio projections ...`: look at and rebuild the read models."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from suzumio.cli.connected import Platform, with_platform
from suzumio.cli.failures import fail
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.apply import Parked
from suzumio.platform.projections.checkpoints import read_all
from suzumio.platform.projections.parking import record_parked
from suzumio.platform.projections.rebuild import (
    RebuildInProgressError,
    RebuildStalledError,
    rebuild,
)
from suzumio.platform.projections.registry import UnknownProjectionError

app = typer.Typer(help="Read models in Postgres, built from the event log.", no_args_is_help=True)
console = Console()
errors = Console(stderr=True)


@app.command("rebuild")
def rebuild_command(
    names: Annotated[
        list[str] | None, typer.Argument(help="projections to rebuild (default: all)")
    ] = None,
) -> None:
    """Replay the log from sequence 1 into fresh tables and swap them in atomically."""
    try:
        # Each once: a name given twice would be replayed twice into one staging schema and
        # swapped in twice (the second finds its schema gone).
        projections = load_projections(list(dict.fromkeys(names)) if names else None)
    except UnknownProjectionError as exc:
        known = ", ".join(p.name for p in load_projections())
        errors.print(f"[red]{escape(str(exc))}[/red] (known: {known})")  # names as typed
        raise typer.Exit(2) from None

    async def run(platform: Platform) -> None:
        listed = ", ".join(p.name for p in projections)
        store = EventStore(platform.nc, platform.topology)

        async def record(parked: list[Parked]) -> None:
            # Before the swap commits: a skipped event never goes without its record (one
            # that cannot be stored leaves the live tables as they were).
            await record_parked(store, parked, consumer="rebuild", attempts=1, strict=True)

        with console.status(f"rebuilding {listed} ..."):
            results = await rebuild(
                platform.nc, platform.dsn, platform.topology, projections, record_parked=record
            )
        for result in results:
            skipped = f", [yellow]{len(result.parked)} skipped[/yellow]" if result.parked else ""
            held = (
                f", [yellow]held before seq {result.held_at}: its event needs a newer"
                " release[/yellow]"
                if result.held_at is not None
                else ""
            )
            console.print(
                f"[green]{result.projection}[/green]: rebuilt to position {result.position}"
                f" ({result.events} events read in {result.seconds:.2f}s){skipped}{held}"
            )

    try:
        with_platform(run)
    except RebuildInProgressError as exc:
        errors.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(1) from None
    except RebuildStalledError as exc:  # nothing was swapped in: the live tables stand
        fail(f"the rebuild stopped, the log stopped delivering: {exc}")


@app.command("status")
def status_command() -> None:
    """Each projection's position in the log and how far behind it is."""

    async def run(platform: Platform) -> None:
        last = await stream_last_seq(platform.nc, platform.topology.events_stream)
        rows = await read_all(platform.pool)
        table = Table("projection", "version", "position", "lag", "rebuilt at")
        for name, cp in sorted(rows.items()):
            rebuilt = cp.rebuilt_at.isoformat(timespec="seconds") if cp.rebuilt_at else ""
            lag = str(max(last - cp.position, 0))
            table.add_row(name, str(cp.version), str(cp.position), lag, rebuilt)
        console.print(f"log position: {last}")
        console.print(table)

    with_platform(run)
