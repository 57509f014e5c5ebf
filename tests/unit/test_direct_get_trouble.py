"""A Direct Get answered with an error status that passes — a replica behind the floor asked
for (412), no leader while a cluster elects one (503) — is trouble, asked again; the
orchestrator took it for a failure of its own and left the activation it was recovering
`running` until the next leader, and the gateway answered 500. A status that refuses the
request itself (400) is no trouble: a bug of ours. The status read from the server's
answer, as `direct_get` reads it (no server needed: the answer is given)."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from suzumio.orchestrator.engine import _trouble
from suzumio.platform.bus.direct_get import DirectGetError, _stored
from suzumio.platform.trouble import is_trouble


def answer(status: str) -> Msg:
    return Msg(_client=None, subject="_INBOX.x", headers={"Status": status}, data=b"")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "passes"), [("412", True), ("503", True), ("408", True), ("400", False)]
)
def test_a_direct_gets_error_is_trouble_when_it_passes(status: str, *, passes: bool) -> None:
    with pytest.raises(DirectGetError) as failed:
        _stored(answer(status))
    assert failed.value.status == int(status)
    assert is_trouble(failed.value) is passes
    assert _trouble(failed.value) is passes


@pytest.mark.parametrize("status", ["404", "204"])
def test_nothing_there_is_no_error(status: str) -> None:
    assert _stored(answer(status)) is None
