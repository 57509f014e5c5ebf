"""The toolbroker: the one door from a sandbox into the platform (DESIGN.md §7)."""
