"""Pure scheduling: state folded from the log and the rules that turn it into decisions
(DESIGN.md §6). No I/O here: only `suzumio.contracts` and the standard library."""
