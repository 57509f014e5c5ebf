import pytest

from suzumio.platform.embedded import process
from suzumio.platform.embedded.process import free_port, free_port_run


def test_free_port_never_hands_out_a_port_twice() -> None:
    # Random draws from the ~22,000 ports below the ephemeral range repeat one about 200 times
    # in 3,000; services started side by side from these ports must not be told the same one.
    ports = [free_port() for _ in range(3000)]

    assert len(set(ports)) == len(ports)


def test_free_port_is_outside_the_ephemeral_range() -> None:
    # An ephemeral port can become any process's outgoing connection's local port between the
    # probe and the server's bind ("Address already in use" in CI); ports outside it can't.
    low, high = process._ephemeral_range()

    assert all(not low <= free_port() <= high for _ in range(200))


@pytest.mark.parametrize(
    ("ephemeral", "lowest", "highest"),
    [
        pytest.param((1024, 60999), 61000, 65534, id="above a range that starts low"),
        pytest.param((1024, 65535), 10000, 65534, id="anywhere when neither side has room"),
    ],
)
def test_a_host_whose_ephemeral_range_starts_low_still_gets_ports(
    monkeypatch: pytest.MonkeyPatch, ephemeral: tuple[int, int], lowest: int, highest: int
) -> None:
    """A tuned `ip_local_port_range` of 1024-… left no room below it: every draw raised."""
    monkeypatch.setattr(process, "_ephemeral_range", lambda: ephemeral)

    firsts = [free_port_run(4) for _ in range(50)]

    assert all(lowest <= first and first + 3 <= highest for first in firsts)
