"""Projections are found through the `suzumio.projections` entry point group, so the projector,
the rebuild command and the tests load them without importing the service that defines them."""

from __future__ import annotations

from importlib.metadata import entry_points

from suzumio.platform.projections.base import Projection

GROUP = "suzumio.projections"


class UnknownProjectionError(LookupError):
    pass


def load_projections(names: list[str] | None = None) -> list[Projection]:
    found: dict[str, Projection] = {}
    for entry in entry_points(group=GROUP):
        cls = entry.load()
        if not (isinstance(cls, type) and issubclass(cls, Projection)):
            raise TypeError(f"entry point {entry.name} is not a Projection class")
        found[cls.name] = cls()
    if names is None:
        return [found[n] for n in sorted(found)]
    missing = [n for n in names if n not in found]
    if missing:
        raise UnknownProjectionError(f"unknown projection(s): {', '.join(missing)}")
    return [found[n] for n in names]
