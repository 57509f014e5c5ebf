"""Pieces of the gateway's edge found in review: what names an API key, the platform's key
file made once and durably, and upload forms bounded as a whole."""

from __future__ import annotations

import hashlib
import stat
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from suzumio.gateway.api.problems import ApiError
from suzumio.gateway.uploads import MAX_FIELD_BYTES, receive_form
from suzumio.platform import apikeys
from suzumio.platform.secrets import KEY_FILE, SecretBox, secret_keys
from suzumio.platform.settings import PlatformSettings


def test_only_a_key_id_a_key_can_have_is_looked_up() -> None:
    minted = apikeys.mint()
    assert apikeys.parse(minted.plaintext) == (minted.key_id, minted.plaintext.split("_", 2)[2])
    secret = "s" * 20
    for key_id in ("", "\x00abcdefgh", "ABCDEFGH", "abc", "a" * 33, "abcd/efgh", "abcdéfgh"):
        assert apikeys.parse(f"szm_{key_id}_{secret}") is None, key_id


def test_the_key_file_is_made_once_for_all_who_race_for_it(tmp_path: Path) -> None:
    settings = PlatformSettings(data_dir=tmp_path / "data")
    with ThreadPoolExecutor(8) as pool:
        keys = list(pool.map(lambda _: secret_keys(settings), range(32)))
    assert all(k == keys[0] for k in keys)
    SecretBox(keys[0])  # a usable key
    path = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [KEY_FILE]  # no temporary left


async def _body(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 4096):
        yield data[i : i + 4096]


def _form(fields: dict[str, str], boundary: str = "b0undary") -> tuple[str, bytes]:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n'
        "Content-Type: text/plain\r\n\r\na\r\n"
    )
    body = "".join(parts) + f"--{boundary}--\r\n"
    return f"multipart/form-data; boundary={boundary}", body.encode()


async def test_many_small_text_fields_are_refused_together() -> None:
    content_type, body = _form({f"f{i}": "v" * 1024 for i in range(MAX_FIELD_BYTES // 1024 + 1)})
    with pytest.raises(ApiError) as refused:
        await receive_form(content_type, _body(body), max_file_bytes=1024, max_total_bytes=4096)
    assert refused.value.status == 413
    content_type, body = _form({"session_id": "s1", "note": "n" * 1000})
    form = await receive_form(content_type, _body(body), max_file_bytes=1024, max_total_bytes=4096)
    try:
        assert form.fields == {"session_id": "s1", "note": "n" * 1000}
        assert [f.filename for f in form.files] == ["a.txt"]
    finally:
        form.close()


def _files(count: int, size: int, boundary: str = "b0undary") -> tuple[str, bytes]:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="f{i}.txt"\r\n'
        f"Content-Type: text/plain\r\n\r\n{'x' * size}\r\n"
        for i in range(count)
    ]
    body = "".join(parts) + f"--{boundary}--\r\n"
    return f"multipart/form-data; boundary={boundary}", body.encode()


async def test_many_files_each_under_the_limit_are_refused_past_the_uploads_total() -> None:
    """Each file under its limit is not enough: an upload of a thousand files of the limit
    each spooled 100 GB to the gateway's disk before anything was checked."""
    content_type, body = _files(5, 1000)
    with pytest.raises(ApiError) as refused:
        await receive_form(content_type, _body(body), max_file_bytes=1024, max_total_bytes=4096)
    assert refused.value.status == 413
    assert "at most 4096 bytes" in refused.value.detail
    content_type, body = _files(4, 1000)
    form = await receive_form(content_type, _body(body), max_file_bytes=1024, max_total_bytes=4096)
    try:
        assert [f.size for f in form.files] == [1000] * 4
    finally:
        form.close()


async def test_a_form_of_many_files_holds_one_descriptor_and_reads_each_back() -> None:
    """Each part opened a temporary file of its own, all open until the upload was stored (a
    thousand commands later): a body of a thousand empty parts took a thousand descriptors,
    and a few such uploads ran the gateway out of them (EMFILE for every socket after)."""

    def open_fds() -> int:
        return sum(1 for _ in Path("/proc/self/fd").iterdir())

    before = open_fds()
    parts = [
        f'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="f{i}.txt"\r\n'
        f"Content-Type: text/plain\r\n\r\n{f'file {i} ' * (i % 3)}\r\n"
        for i in range(500)
    ]
    body = ("".join(parts) + "--b0undary--\r\n").encode()
    content_type = "multipart/form-data; boundary=b0undary"
    form = await receive_form(
        content_type, _body(body), max_file_bytes=1024, max_total_bytes=1 << 20
    )
    try:
        assert open_fds() - before <= 1
        assert len(form.files) == 500
        for i, received in enumerate(form.files):
            expected = (f"file {i} " * (i % 3)).encode()
            assert received.size == len(expected)
            assert received.sha256 == hashlib.sha256(expected).hexdigest()
            reader = received.file
            assert reader.read(3) + reader.read() == expected  # in pieces, as put_blob reads
            assert reader.read() == b""
            assert received.file.read() == expected  # and again from the start
    finally:
        form.close()
    assert open_fds() <= before
