"""What docker sandboxes join under `suzumio up`: an engine's bridge reaches this machine only
through its gateway address, where a listener on loopback does not answer."""

from __future__ import annotations

from pathlib import Path

from suzumio.cli.app import NETWORK_SETTING, broker_socket, docker_network


def test_with_the_broker_or_the_demo_model_on_loopback_sandboxes_share_the_hosts_network() -> None:
    host = {NETWORK_SETTING: "host"}
    assert docker_network("127.0.0.1", demo_model=False, environ={}) == host
    assert docker_network("localhost", demo_model=False, environ={}) == host
    assert docker_network("0.0.0.0", demo_model=True, environ={}) == host  # noqa: S104


def test_a_model_server_on_loopback_keeps_the_hosts_network() -> None:
    ollama = {"SUZUMIO_MODEL_BASE_URL": "http://127.0.0.1:11434/v1"}
    assert docker_network("0.0.0.0", demo_model=False, environ=ollama) == {  # noqa: S104
        NETWORK_SETTING: "host"
    }


def test_listeners_on_every_address_and_a_real_model_leave_the_bridge() -> None:
    assert docker_network("0.0.0.0", demo_model=False, environ={}) == {}  # noqa: S104
    assert docker_network("192.0.2.7", demo_model=False, environ={}) == {}
    remote = {"SUZUMIO_MODEL_BASE_URL": "https://api.example.com/v1"}
    assert docker_network("0.0.0.0", demo_model=False, environ=remote) == {}  # noqa: S104


def test_a_network_set_in_the_environment_wins() -> None:
    environ = {NETWORK_SETTING: "my-net"}
    assert docker_network("127.0.0.1", demo_model=True, environ=environ) == {}


def test_up_puts_the_brokers_socket_in_the_data_directory_unless_told_otherwise() -> None:
    data = Path("/srv/suzumio")  # nothing is made: only the path is chosen
    assert broker_socket(data, {}) == {"SUZUMIO_BROKER_SOCKET": str(data / "run" / "broker.sock")}
    assert broker_socket(data, {"SUZUMIO_BROKER_SOCKET": "/elsewhere.sock"}) == {}
    # Deeper than a socket's address holds: unset (network 'none' then says so), not a broker
    # that cannot start.
    assert broker_socket(data / ("x" * 110), {}) == {}
    relative = broker_socket(Path(".suzumio"), {})["SUZUMIO_BROKER_SOCKET"]
    assert Path(relative).is_absolute()
