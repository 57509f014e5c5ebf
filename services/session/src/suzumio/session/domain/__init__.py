"""Pure domain: aggregate states folded from events, and decisions that turn commands into new
events or typed errors. No I/O here: only `suzumio.contracts` and the standard library."""
