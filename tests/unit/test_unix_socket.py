"""The Unix socket a service serves on besides its port (`suzumio.platform.service.unix_socket`):
made afresh over what a dead process left, never over a live one's or a file."""

from __future__ import annotations

import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from suzumio.platform.service.unix_socket import SocketPathError, bind_unix


@pytest.fixture
def short_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # pytest's own directories may be longer than a socket's address holds
    import tempfile  # noqa: PLC0415

    where = Path(tempfile.mkdtemp(prefix="szu-", dir="/tmp"))  # noqa: S108
    yield where
    shutil.rmtree(where)


def test_a_socket_is_made_connectable_by_anyone_in_a_new_directory(short_dir: Path) -> None:
    path = short_dir / "run" / "b.sock"
    listener = bind_unix(path)
    try:
        assert stat.S_ISSOCK(path.lstat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
        listener.sock.listen()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
    finally:
        listener.sock.close()
        listener.remove()
    assert not path.exists()


def test_what_a_dead_process_left_is_replaced_but_a_live_one_is_not_taken_over(
    short_dir: Path,
) -> None:
    path = short_dir / "b.sock"
    dead = bind_unix(path)
    dead.sock.close()  # its file stays, nobody answers on it
    live = bind_unix(path)
    try:
        live.sock.listen()
        with pytest.raises(SocketPathError, match="another process is serving"):
            bind_unix(path)
        assert path.exists()
    finally:
        live.sock.close()
    # The newer one's file is not removed by the older one's end.
    dead.remove()
    assert path.exists()
    live.remove()
    assert not path.exists()


def test_a_file_or_a_path_too_long_is_refused(short_dir: Path) -> None:
    plain = short_dir / "notes.txt"
    plain.write_text("mine")
    with pytest.raises(SocketPathError, match="not a socket"):
        bind_unix(plain)
    assert plain.read_text() == "mine"
    with pytest.raises(SocketPathError, match="longer than 107 bytes"):
        bind_unix(short_dir / ("x" * 120))
    with pytest.raises(SocketPathError, match="absolute"):
        bind_unix(Path("relative.sock"))
    assert [p.name for p in short_dir.iterdir()] == ["notes.txt"]
