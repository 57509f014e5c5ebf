"""Model-facing tools that run inside the sandbox (DESIGN.md §9, §10)."""
