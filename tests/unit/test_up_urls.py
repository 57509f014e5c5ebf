"""`suzumio up --host` with an IPv6 address: the broker URL given to runners, and the addresses
the banner shows, bracket it (`http://::1:8081` is no URL: every activation failed)."""

from __future__ import annotations

import httpx
import pytest

from suzumio.cli.app import _reachable
from suzumio.cli.supervisor import url_host


@pytest.mark.parametrize(
    ("host", "reached"),
    [
        ("::1", "[::1]"),
        ("fd00::5", "[fd00::5]"),
        ("::", "127.0.0.1"),
        ("0.0.0.0", "127.0.0.1"),  # noqa: S104
        ("10.1.2.3", "10.1.2.3"),
        ("box.local", "box.local"),
    ],
)
def test_the_broker_url_names_any_host_as_a_url_does(host: str, reached: str) -> None:
    url = f"http://{_reachable(host)}:8081"
    assert url == f"http://{reached}:8081"
    assert httpx.URL(url).port == 8081  # a URL every client parses


def test_an_address_already_in_brackets_is_kept() -> None:
    assert url_host("[::1]") == "[::1]"
