"""Projections: read models in Postgres, kept up to date from the event log and rebuildable.

A projection is a pure function of the log: its tables can always be dropped and rebuilt from
sequence 1 (`suzumio projections rebuild`), and a rebuild must equal the live tables.
"""

from suzumio.platform.projections.base import Projection, live_schema
from suzumio.platform.projections.registry import load_projections

__all__ = ["Projection", "live_schema", "load_projections"]
