"""`suzumio agents import`'s packing, and the gateway's reading of what it packs: a directory
pointed at by mistake stops at the API's limits, version control's data stays out, and a file
name that is not UTF-8 is refused on both sides instead of travelling as lone surrogates."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
import typer

from suzumio.cli import agents
from suzumio.gateway.packages import PackageError, read_package

MANIFEST = b"name: a\nrole: r\nmodel: m\n"


def _names(archive: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return tar.getnames()


def test_version_control_data_is_left_out_and_the_rest_kept_in_order(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_bytes(MANIFEST)
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "objects" / "ab").write_bytes(b"blob")
    (tmp_path / "prompt").mkdir()
    (tmp_path / "prompt" / "system.md").write_text("be brief")
    (tmp_path / ".env.example").write_text("X=1")
    assert _names(agents.pack(tmp_path)) == [".env.example", "agent.yaml", "prompt/system.md"]


def test_packing_stops_past_what_the_api_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agents, "MAX_ENTRIES", 3)
    for i in range(4):
        (tmp_path / f"f{i}.md").write_text("x")
    with pytest.raises(typer.BadParameter, match="more than a package may"):
        agents.pack(tmp_path)
    (tmp_path / "f3.md").unlink()
    monkeypatch.setattr(agents, "MAX_UNPACKED_BYTES", 2)
    with pytest.raises(typer.BadParameter, match="more than a package may"):
        agents.pack(tmp_path)


def test_a_file_name_that_is_not_utf8_is_refused_when_packed(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_bytes(MANIFEST)
    (tmp_path / os.fsdecode(b"caf\xe9.md")).write_bytes(b"x")
    with pytest.raises(typer.BadParameter, match="must be UTF-8"):
        agents.pack(tmp_path)


def test_the_gateway_refuses_an_archive_entry_whose_name_is_not_utf8() -> None:
    """tarfile reads such a name with lone surrogates: it became an asset's path that no
    command could be written out with (a 500), under a name nobody sent."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", encoding="utf-8") as tar:
        for name, body in ((b"agent.yaml", MANIFEST), (b"caf\xe9.md", b"x")):
            info = tarfile.TarInfo(name.decode(errors="surrogateescape"))
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    with pytest.raises(PackageError, match="not UTF-8"):
        read_package(buffer.getvalue())
