"""Embedded servers: a JetStream-enabled nats-server and a Postgres, from their PyPI wheels."""

from suzumio.platform.embedded.nats import start_nats
from suzumio.platform.embedded.postgres import start_postgres
from suzumio.platform.embedded.process import RunningServer
from suzumio.platform.embedded.servers import EmbeddedServers

__all__ = ["EmbeddedServers", "RunningServer", "start_nats", "start_postgres"]
