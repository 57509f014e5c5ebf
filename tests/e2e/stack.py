"""The platform as processes, for end-to-end tests through HTTP: the session service and the
gateway (the services the API needs), on the test servers, in their own namespace and
database, with JSON logs in files the tests can read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from nats.aio.client import Client as NATS

from suzumio.cli.admin import bootstrap_admin
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.platform.secrets import SecretBox
from suzumio.testing import servers
from suzumio.testing.processes import ServiceProcess

MAX_UPLOAD = 256 * 1024
MAX_ARTIFACT = 256 * 1024  # what a sandbox may send back per file (the broker, the collector)


@dataclass
class Stack:
    api: str
    admin_key: str
    topology: Topology
    nats_url: str
    database_url: str
    nc: NATS
    store: EventStore
    mount_root: Path
    logs: list[Path]
    processes: list[ServiceProcess] = field(default_factory=list)
    secret_key: str = ""

    def url_of(self, service: str) -> str:
        port = next(p.port for p in self.processes if p.name == service)
        return f"http://127.0.0.1:{port}"

    def client(self, key: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.api, headers=headers, timeout=30.0)


@asynccontextmanager
async def running_stack(
    nats_url: str,
    postgres_url: str,
    tmp: Path,
    services: tuple[str, ...] = ("session", "gateway"),
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """The services named (the gateway always last in `processes`' order given)."""
    # On a NATS cluster (`SUZUMIO_REPLICAS` in `extra_env`), the streams made here are
    # replicated as the services would make them.
    replicas = int((extra_env or {}).get("SUZUMIO_REPLICAS", "1"))
    topology = servers.fresh_topology().model_copy(update={"replicas": replicas})
    database_url = await servers.create_database(postgres_url)
    mount_root = tmp / "mounts"
    mount_root.mkdir(parents=True)
    secret_key = SecretBox.generate_key()
    env = {
        "SUZUMIO_DATA_DIR": str(tmp / "data"),
        "SUZUMIO_SECRET_KEY": secret_key,
        "SUZUMIO_MOUNT_ROOTS": str(mount_root),
        "SUZUMIO_MAX_UPLOAD_BYTES": str(MAX_UPLOAD),
        "SUZUMIO_MAX_ARTIFACT_BYTES": str(MAX_ARTIFACT),
        "SUZUMIO_READ_YOUR_WRITES_TIMEOUT": "5",
        "SUZUMIO_STREAM_RECHECK_SECONDS": "0.5",
        "SUZUMIO_WORK_DIR": str(tmp / "sandboxes"),
        **(extra_env or {}),
    }
    procs = [
        ServiceProcess(name, nats_url, database_url, topology, tmp / f"{name}.log", env)
        for name in services
    ]
    for proc in procs:  # sandboxes reach the broker wherever the test put it
        if proc.name == "toolbroker":
            env["SUZUMIO_BROKER_URL"] = f"http://127.0.0.1:{proc.port}"
    nc = await connection.connect(nats_url, "suzumio-e2e")
    await ensure_streams(nc, topology.streams())
    try:
        for proc in procs:
            proc.start()
        await asyncio.gather(*(p.wait_ready() for p in procs))
        admin_key = await bootstrap_admin(nc, topology, None)
        assert admin_key is not None
        api = f"http://127.0.0.1:{next(p.port for p in procs if p.name == 'gateway')}"
        await _admitted(api, admin_key)
        yield Stack(
            api=api, admin_key=admin_key, topology=topology,
            nats_url=nats_url, database_url=database_url, nc=nc,
            store=EventStore(nc, topology), mount_root=mount_root,
            logs=[p.log_path for p in procs], processes=procs, secret_key=secret_key,
        )  # fmt: skip
    finally:
        # All at once: each drains on its own, and one after another they add up to seconds
        # on every stack.
        await asyncio.gather(
            *(
                proc.terminate()
                for proc in procs
                if proc.process is not None and proc.process.poll() is None
            )
        )
        await nc.close()
        await servers.drop_database(postgres_url, database_url)


async def _admitted(api: str, admin_key: str, timeout: float = 60.0) -> None:
    """Once the gateway knows the admin key: a fresh stack's projector, on a loaded machine,
    may show it later than the gateway waits (it answers 503 meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout
    headers = {"Authorization": f"Bearer {admin_key}"}
    async with httpx.AsyncClient(base_url=api, headers=headers, timeout=30.0) as c:
        while (answer := await c.get("/v1/me")).status_code == 503:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
    assert answer.status_code == 200, (answer.status_code, answer.text)
