"""The embedded NATS server writes the event log to disk every second, not every 2 minutes
(nats-server's default): on one node nothing replicates, and an OS crash or a power cut loses
what was not written. `SUZUMIO_NATS_SYNC_INTERVAL` sets it ('always': each message). Real
nats-server processes, read back through their monitoring endpoint."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from suzumio.platform.embedded.nats import CONFIG_FILE, start_nats
from suzumio.platform.embedded.servers import EmbeddedServers
from suzumio.platform.settings import PlatformSettings


def _jetstream_config(monitoring: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{monitoring}/varz", timeout=10) as answer:
        config: dict[str, Any] = json.load(answer)["jetstream"]["config"]
    return config


@pytest.mark.parametrize(
    ("given", "interval_ns", "always"),
    [(None, 1_000_000_000, False), ("250ms", 250_000_000, False), ("always", None, True)],
)
def test_the_server_syncs_as_configured(
    tmp_path: Path, given: str | None, interval_ns: int | None, *, always: bool
) -> None:
    if given is None:
        server = start_nats(tmp_path / "nats")
    else:
        server = start_nats(tmp_path / "nats", sync_interval=given)
    try:
        config = _jetstream_config(server.extra["monitoring"])
    finally:
        server.stop()
    assert config.get("sync_always", False) is always
    if interval_ns is not None:
        assert config["sync_interval"] == interval_ns


def test_the_setting_reaches_the_embedded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUZUMIO_NATS_SYNC_INTERVAL", "always")
    settings = PlatformSettings(data_dir=tmp_path / "data")
    servers = EmbeddedServers(
        settings.data_dir, durable=False, nats_sync_interval=settings.nats_sync_interval
    ).ensure(need_postgres=False)
    try:
        # Without a monitoring listener (the embedded servers open none), its configuration.
        config = (settings.data_dir / "nats" / CONFIG_FILE).read_text()
        assert 'sync_interval: "always"' in config
    finally:
        servers.stop()


@pytest.mark.parametrize("wrong", ["sometimes", "0s", "1 s", "-1s", "10"])
def test_a_wrong_interval_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    monkeypatch.setenv("SUZUMIO_NATS_SYNC_INTERVAL", wrong)
    with pytest.raises(ValidationError, match="nats_sync_interval"):
        PlatformSettings()
