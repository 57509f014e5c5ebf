"""The scheduler service: turns pending signals into activation requests (DESIGN.md §6)."""
