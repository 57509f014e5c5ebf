from suzumio.platform.embedded.process import _ephemeral_low, free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    # Random draws from the ~22,000 ports below the ephemeral range repeat one about 200 times
    # in 3,000; services started side by side from these ports must not be told the same one.
    ports = [free_port() for _ in range(3000)]

    assert len(set(ports)) == len(ports)


def test_free_port_is_below_the_ephemeral_range() -> None:
    # An ephemeral port can become any process's outgoing connection's local port between the
    # probe and the server's bind ("Address already in use" in CI); ports below the range can't.
    low = _ephemeral_low()

    assert all(1024 < free_port() < low for _ in range(200))
