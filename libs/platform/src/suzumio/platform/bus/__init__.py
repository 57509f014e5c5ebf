"""The NATS JetStream bus: connection, streams, the event store, commands and consumers."""
