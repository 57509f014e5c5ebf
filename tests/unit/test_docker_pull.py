"""A failed pull fails its launch for good only where the registry said the image is not to be
had: a registry away, rate-limiting or failing for now fails it retryable (it failed the
activation for good before). docker-py's client is a stand-in here: no registry can be
reached from this machine, and each answer below is one a registry gives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from docker.errors import APIError, ImageNotFound  # type: ignore[import-untyped]

from suzumio.orchestrator.backends.base import LaunchError
from suzumio.orchestrator.backends.docker import DockerBackend


class _Response:
    def __init__(self, status: int, reason: str) -> None:
        self.status_code = status
        self.reason = reason
        self.url = "http://engine/images/create"


class _Engine:
    """Pulls as a registry answered: raising an engine error, or a stream that ends in one."""

    def __init__(
        self, raises: Exception | None = None, stream: tuple[dict[str, Any], ...] = ()
    ) -> None:
        self._raises = raises
        self._stream = stream

    def pull(self, image: str) -> str:
        if self._raises is not None:
            raise self._raises
        return "\n".join(json.dumps(line) for line in self._stream)

    def inspect_image(self, image: str) -> None:
        raise ImageNotFound(f"No such image: {image}")


def _api_error(status: int, explanation: str) -> APIError:
    return APIError("pull failed", _Response(status, "x"), explanation=explanation)


@pytest.mark.parametrize(
    ("engine", "retryable"),
    [
        (
            _Engine(_api_error(500, "Get https://r.example/v2/: net/http: TLS handshake timeout")),
            True,
        ),
        (_Engine(_api_error(500, "toomanyrequests: You have reached your pull rate limit")), True),
        (_Engine(_api_error(429, "toomanyrequests")), True),
        (
            _Engine(
                stream=(
                    {"status": "Pulling"},
                    {"error": "toomanyrequests: rate limit"},
                )
            ),
            True,
        ),
        (
            _Engine(
                stream=({"error": "received unexpected HTTP status: 503 Service Unavailable"},)
            ),
            True,
        ),
        (_Engine(stream=({"status": "Pulling"},)), True),  # cut short: no word of why
        (_Engine(_api_error(404, "manifest for app:nope not found: manifest unknown")), False),
        (_Engine(_api_error(400, "invalid reference format")), False),
        (
            _Engine(stream=({"error": "pull access denied for app, repository does not exist"},)),
            False,
        ),
    ],
)
def test_a_failed_pull_is_for_good_only_when_the_image_is_not_to_be_had(
    engine: _Engine, retryable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = DockerBackend()
    monkeypatch.setattr(backend, "_client", lambda: engine)
    with pytest.raises(LaunchError, match="image app:nope") as failed:
        backend._pull_sync("app:nope")
    assert failed.value.retryable is retryable, failed.value
