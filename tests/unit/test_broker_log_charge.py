"""Which failures of a call that writes to the log give its bytes back to the activation's
budget (`toolbroker.routes._refused`): a refusal wrote nothing; trouble may have written."""

from __future__ import annotations

import pytest

from suzumio.contracts.errors import (
    CommandError,
    CommandTimeoutError,
    ConflictError,
    ForbiddenError,
    InternalError,
    InvalidError,
    NotFoundError,
    UnavailableError,
)
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.routes import _refused


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (BrokerError(409, "limit_reached", "x"), True),
        (BrokerError(422, "invalid", "x"), True),
        (BrokerError(503, "unavailable", "x"), False),
        (InvalidError("x"), True),
        (ConflictError("x"), True),
        (NotFoundError("x"), True),
        (ForbiddenError("x"), True),
        # An append stored with its answer lost comes back unavailable: it may be written.
        (UnavailableError("x"), False),
        (CommandTimeoutError("x"), False),
        (InternalError("x"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_only_a_refusal_gives_the_bytes_back(
    error: BrokerError | CommandError, refused: bool
) -> None:
    assert _refused(error) is refused
