"""The `suzumio` command, and the all-in-one supervisor behind `suzumio up`."""
