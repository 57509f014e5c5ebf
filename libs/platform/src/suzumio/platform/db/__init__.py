"""Postgres: connection pools and idempotent SQL migrations."""
