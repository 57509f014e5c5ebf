"""A NATS URL setting as nats-py gets it: every server listed, and the credentials as the
connection's own, so they go to the cluster nodes a client learns of too (`nats_servers`;
the failover itself: tests/fault/test_nats_cluster.py)."""

from __future__ import annotations

from suzumio.contracts.nats_servers import nats_servers
from suzumio.platform.embedded.credentials import redact


def test_a_token_in_the_url_is_the_connections_token() -> None:
    assert nats_servers("nats://s3cr%2Ft@127.0.0.1:4222") == (
        ["nats://s3cr%2Ft@127.0.0.1:4222"],
        {"token": "s3cr/t"},
    )


def test_a_user_and_password_are_the_connections() -> None:
    assert nats_servers("nats://me:p%40ss@nats:4222")[1] == {"user": "me", "password": "p@ss"}


def test_several_servers_comma_separated_share_the_first_credentials() -> None:
    servers, credentials = nats_servers(" nats://a:4222, nats://tok@b:4222 ,,nats://c:4222")
    assert servers == ["nats://a:4222", "nats://tok@b:4222", "nats://c:4222"]
    assert credentials == {"token": "tok"}


def test_no_credentials_none_given() -> None:
    assert nats_servers("nats://127.0.0.1:4222") == (["nats://127.0.0.1:4222"], {})
    assert nats_servers("localhost:4222") == (["localhost:4222"], {})


def test_each_url_of_a_list_is_redacted() -> None:
    """What the CLI and `up` print (a cluster's nodes, each with the token)."""
    assert redact("nats://tokA@a:4222,nats://tokA@b:4222") == "nats://***@a:4222,nats://***@b:4222"
    assert redact("postgresql://u:pw@db/x") == "postgresql://u:***@db/x"
