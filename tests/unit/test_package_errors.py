"""An agent package whose agent.yaml does not validate is refused with where and why, not
with the values it holds (a pasted secret, a prompt of megabytes)."""

from __future__ import annotations

import io
import zipfile

import pytest

from suzumio.gateway.packages import PackageError, read_package

SECRET = "sk-live-0123456789abcdefghij"


def package(agent_yaml: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("agent.yaml", agent_yaml)
    return buffer.getvalue()


def test_a_refused_manifest_does_not_echo_its_values() -> None:
    with pytest.raises(PackageError) as refused:
        read_package(package(f"name: a\nrole: r\nmodel: m\napi_key: {SECRET}\ntools: {SECRET}\n"))
    message = str(refused.value)
    assert "api_key" in message  # where
    assert "tools" in message
    assert SECRET not in message
