from suzumio.platform.embedded.process import free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    # The kernel offers a just-closed port again often enough that 3,000 draws from its
    # ~28,000 ephemeral ports repeat one about 150 times; services started side by side
    # from these ports must not be told the same one.
    ports = [free_port() for _ in range(3000)]

    assert len(set(ports)) == len(ports)
