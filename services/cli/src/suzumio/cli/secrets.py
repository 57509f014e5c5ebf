"""`suzumio secrets reseal`: rotate the platform's secret key.

Provider keys are stored in the log sealed with the platform's secret key (`SUZUMIO_SECRET_KEY`:
keys separated by commas, the first one current). To rotate: put the new key first and keep
the old one after it on every service, run this command with the same setting, and drop the
old key once `suzumio secrets reseal --dry-run` finds nothing left (and, since activation
tokens and stored idempotent replies are sealed with it too, once the activations running
then have ended and a day has passed).

Every project is found in the log itself (a projection may lag behind a key set a moment
ago), each provider's latest key read from its project's events, and every key sealed with
another key than the current one is sealed again and stored with `ResealProviderKey` — which
the session service applies only while the stored key is still the one read, so a key set
meanwhile is never replaced by an older one (the command reads again and retries).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from nats.aio.client import Client as NATS
from rich.console import Console
from rich.markup import escape

from suzumio.cli.connected import Platform, with_platform
from suzumio.cli.failures import fail, first_line, load_settings
from suzumio.contracts.commands import ResealProviderKey
from suzumio.contracts.errors import ConflictError, NotFoundError
from suzumio.contracts.events import ProviderRemoved, ProviderSet
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import EncryptedSecret
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import API_PREFIX, request
from suzumio.platform.secrets import KEY_FILE, SecretBox, SecretError, secret_box

app = typer.Typer(help="The platform's secret key.", no_args_is_help=True)
console = Console()

ACTOR = "system:operator"
ATTEMPTS = 5  # reads and reseals of one provider whose key keeps changing under us
INFO_TIMEOUT = 10.0


@dataclass(frozen=True)
class Sealed:
    project_id: str
    name: str
    secret: EncryptedSecret


@dataclass
class Tally:
    resealed: int = 0
    current: int = 0
    unreadable: int = 0
    gone: int = 0


@app.command("reseal")
def reseal_command(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only say which keys would be sealed again")
    ] = False,
) -> None:
    """Seal every stored provider key again with the current (first) secret key."""
    settings = load_settings()
    key_file = Path(settings.data_dir) / KEY_FILE
    if settings.secret_key is None and not key_file.exists():
        # A key made here (as a service makes one on first start) could open nothing sealed
        # before: every provider key would be counted as unopenable, and the file left behind.
        fail(
            f"no secret key: set SUZUMIO_SECRET_KEY, or SUZUMIO_DATA_DIR to the platform's data "
            f"directory ({key_file} does not exist)",
            code=2,
        )
    try:
        box = secret_box(settings)
    except SecretError as exc:
        fail(f"SUZUMIO_SECRET_KEY: {exc}", code=2)
    except OSError as exc:
        fail(f"the secret key file {key_file} cannot be read: {first_line(exc)}", code=2)

    async def run(platform: Platform) -> Tally:
        store = EventStore(platform.nc, platform.topology)
        client = CommandClient(platform.nc, platform.topology)
        tally = Tally()
        for project_id in await project_ids(platform.nc, platform.topology):
            for name in sorted(await _providers(store, project_id)):
                await _reseal_one(store, client, box, project_id, name, tally, dry_run=dry_run)
        return tally

    tally = with_platform(run)
    verb = "would be sealed again" if dry_run else "sealed again"
    console.print(
        f"{tally.resealed} provider key(s) {verb} with key {box.current_key_id};"
        f" {tally.current} already sealed with it"
    )
    if tally.unreadable:
        fail(
            f"{tally.unreadable} provider key(s) cannot be opened with the configured keys:"
            " keep the key that sealed them in SUZUMIO_SECRET_KEY (after the current one)"
        )


async def _reseal_one(
    store: EventStore,
    client: CommandClient,
    box: SecretBox,
    project_id: str,
    name: str,
    tally: Tally,
    *,
    dry_run: bool,
) -> None:
    where = f"project {project_id} provider {escape(name)}"
    for _ in range(ATTEMPTS):
        stored = (await _providers(store, project_id)).get(name)
        if stored is None:
            tally.gone += 1  # removed, or its key dropped, since the project was read
            return
        if stored.key_id == box.current_key_id:
            tally.current += 1
            return
        try:
            resealed = box.reseal(stored)
        except SecretError:
            console.print(f"[red]{where}: sealed with key {stored.key_id}, which is not configured")
            tally.unreadable += 1
            return
        if dry_run:
            console.print(f"{where}: key {stored.key_id} → {box.current_key_id}")
            tally.resealed += 1
            return
        command = ResealProviderKey(
            project_id=project_id, name=name, previous=stored, api_key=resealed
        )
        try:
            await client.send(command, actor=ACTOR)
        except ConflictError:
            continue  # set again meanwhile (or our append raced another): read it again
        except NotFoundError:
            tally.gone += 1
            return
        console.print(f"{where}: key {stored.key_id} → {box.current_key_id}")
        tally.resealed += 1
        return
    fail(f"{where}: its key kept changing while it was sealed again; run the command again")


async def _providers(store: EventStore, project_id: str) -> dict[str, EncryptedSecret]:
    """The project's providers that have a key, as its log says now."""
    keys: dict[str, EncryptedSecret] = {}
    for event in (await store.load("project", project_id)).events:
        match event.data:
            case ProviderSet(name=name, spec=spec):
                if spec.api_key is None:
                    keys.pop(name, None)
                else:
                    keys[name] = spec.api_key
            case ProviderRemoved(name=name):
                keys.pop(name, None)
    return keys


async def project_ids(nc: NATS, topology: Topology) -> list[str]:
    """Every project in the event log, from its subjects (the stream's own index)."""
    ids: set[str] = set()
    subject = f"{API_PREFIX}.STREAM.INFO.{topology.events_stream}"
    while True:
        # A page of at most `limit` subjects (the server sorts them when it pages) of `total`.
        info = await request(
            nc,
            subject,
            {"subjects_filter": topology.events_filter("project"), "offset": len(ids)},
            INFO_TIMEOUT,
        )
        page = info.get("state", {}).get("subjects") or {}
        before = len(ids)
        ids.update(topology.parse_event_subject(s)[1] for s in page)
        if len(ids) == before or len(ids) >= int(info.get("total", 0)):
            return sorted(ids)
