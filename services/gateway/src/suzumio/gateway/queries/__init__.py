"""Read-side SQL over the projections (schemas `proj_<name>`, see docs/projections.md)."""
