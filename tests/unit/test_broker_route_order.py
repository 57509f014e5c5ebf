"""The tool-broker matches a request's path against its routes in turn: the calls every
activation makes are tried first (`bootstrap.HOT_PATHS`), and every route is still there."""

from __future__ import annotations

from suzumio.toolbroker.bootstrap import HOT_PATHS, create_app
from suzumio.toolbroker.routes import router


def _routes() -> list[tuple[str, frozenset[str]]]:
    return [(r.path, frozenset(r.methods)) for r in router.routes]  # type: ignore[attr-defined]


def test_the_activation_calls_are_matched_first_and_no_route_is_lost() -> None:
    before = sorted(_routes(), key=repr)
    create_app(None)  # type: ignore[arg-type]
    create_app(None)  # type: ignore[arg-type]  # a second app: the same order
    after = _routes()
    assert [path for path, _ in after[: len(HOT_PATHS)]] == list(HOT_PATHS)
    assert sorted(after, key=repr) == before
