"""Test fixtures for Suzumio: real NATS and Postgres on ephemeral ports (the same code as the
embedded servers of `suzumio up`), isolated per test by namespace and database."""
