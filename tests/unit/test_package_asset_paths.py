"""An agent package whose assets no workspace can hold together is refused at import: else
every activation of the agent would fail to set them out under `/workspace/assets`."""

from __future__ import annotations

import io
import tarfile

import pytest

from suzumio.gateway.packages import PackageError, read_package

AGENT_YAML = b"name: a\nrole: r\nmodel: m\n"


def tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def test_an_asset_under_another_assets_path_is_refused() -> None:
    with pytest.raises(PackageError, match="'docs/a.md' lies under the file 'docs'"):
        read_package(tar({"agent.yaml": AGENT_YAML, "docs": b"x", "docs/a.md": b"y"}))


def test_assets_side_by_side_are_taken() -> None:
    package = read_package(
        tar({"agent.yaml": AGENT_YAML, "docs/a.md": b"y", "docs.md": b"x", "d/e/f": b"z"})
    )
    assert [a.path for a in package.assets] == ["d/e/f", "docs.md", "docs/a.md"]
