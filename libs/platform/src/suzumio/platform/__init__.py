"""Suzumio's shared mechanisms: the JetStream bus and event store, projections, the database,
settings, logs and telemetry, the service runtime and the embedded NATS and Postgres servers.

No service logic lives here (DESIGN.md §3).
"""
