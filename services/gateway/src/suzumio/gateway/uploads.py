"""Streaming multipart uploads: each file part is hashed and spooled to disk as it arrives (all
of a form's in one file), with a size cap enforced while reading, so a huge upload is refused
before it fills a disk."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from suzumio.gateway.api.problems import ApiError

if TYPE_CHECKING:  # defined for type checkers only
    from python_multipart.multipart import MultipartCallbacks

MAX_FIELD_BYTES = 64 * 1024  # all text fields of a form together, names included
_MEDIA_PART = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MEDIA_TYPE = re.compile(rf"{_MEDIA_PART}/{_MEDIA_PART}")
OCTET_STREAM = "application/octet-stream"


def media_type(value: str | None) -> str:
    """The `type/subtype` of a declared content type, lowercased; parameters and anything that
    is not a well-formed media type become `application/octet-stream`, so a stored type can
    never smuggle header syntax into a later download."""
    essence = (value or "").split(";", 1)[0].strip()
    return essence.lower() if _MEDIA_TYPE.fullmatch(essence) else OCTET_STREAM


class Spool:
    """A form's file parts, one after the other in one temporary file (made at the first):
    an upload of a thousand parts holds one descriptor, not one a part — a member could run
    the gateway out of them with a body of empty parts."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self.size = 0

    def write(self, chunk: bytes) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 - closed by close()
        self._file.write(chunk)
        self.size += len(chunk)

    def read_at(self, offset: int, size: int) -> bytes:
        if self._file is None or size <= 0:
            return b""
        return os.pread(self._file.fileno(), size, offset)  # no shared position to move

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class FileWindow:
    """One file of a spool, read from its start (by `put_blob`, on threads)."""

    def __init__(self, spool: Spool, offset: int, size: int) -> None:
        self._spool, self._offset, self._size = spool, offset, size
        self._at = 0

    def read(self, n: int = -1) -> bytes:
        left = self._size - self._at
        wanted = left if n is None or n < 0 else min(n, left)
        data = self._spool.read_at(self._offset + self._at, wanted)
        self._at += len(data)
        return data


@dataclass
class ReceivedFile:
    name: str  # the form field's name
    filename: str
    content_type: str
    spool: Spool
    offset: int  # where its bytes begin in the spool
    size: int = 0
    sha256: str = ""

    @property
    def file(self) -> FileWindow:
        """Its bytes, read from the start (each call a reader of its own)."""
        return FileWindow(self.spool, self.offset, self.size)


@dataclass
class ReceivedForm:
    files: list[ReceivedFile]
    fields: dict[str, str]
    spool: Spool = field(default_factory=Spool)

    def close(self) -> None:
        self.spool.close()


class _FormParser:
    """python-multipart callbacks that spool file parts and keep text fields."""

    def __init__(self, max_file_bytes: int, max_files: int, max_total_bytes: int) -> None:
        self.form = ReceivedForm([], {})
        self._max_file_bytes = max_file_bytes
        self._max_files = max_files
        self._max_total_bytes = max_total_bytes
        self._total_bytes = 0  # of every file part so far, spooled to disk
        self._headers: dict[str, str] = {}
        self._field = bytearray()
        self._value = bytearray()
        self._file: ReceivedFile | None = None
        self._name = ""
        self._digest = hashlib.sha256()
        self._text = bytearray()
        self._field_bytes = 0  # kept in memory for the text fields so far (bounded as a whole)

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": self.header_field,
            "on_header_value": self.header_value,
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
        }

    def part_begin(self) -> None:
        self._headers, self._file, self._name = {}, None, ""
        self._digest, self._text = hashlib.sha256(), bytearray()

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def header_end(self) -> None:
        name = self._field.decode("latin-1").lower()
        # latin-1 keeps the raw bytes: parse_options_header encodes back to latin-1, and a
        # filename is then decoded as the UTF-8 that browsers and HTTP clients send.
        self._headers[name] = self._value.decode("latin-1")
        self._field.clear()
        self._value.clear()

    def headers_finished(self) -> None:
        _, disposition = parse_options_header(self._headers.get("content-disposition"))
        self._name = disposition.get(b"name", b"").decode("utf-8", "replace")
        filename = disposition.get(b"filename")
        if filename is None:
            self._keep_text(len(self._name))
            return
        if len(self.form.files) >= self._max_files:
            raise ApiError(413, f"at most {self._max_files} files per upload")
        try:
            name = filename.decode()
        except UnicodeDecodeError:
            # Replacing the bytes would keep the file under a name nobody sent (and make
            # different names one): the client's error, said before anything is stored.
            raise ApiError(422, "a file name must be UTF-8") from None
        content_type = media_type(self._headers.get("content-type"))
        spool = self.form.spool
        self._file = ReceivedFile(self._name, name, content_type, spool, spool.size)
        self.form.files.append(self._file)

    def part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._file is None:
            self._keep_text(len(chunk))
            self._text += chunk
            return
        self._file.size += len(chunk)
        if self._file.size > self._max_file_bytes:
            raise ApiError(
                413,
                f"{self._file.filename} is larger than the limit of {self._max_file_bytes} bytes",
            )
        # Each file under its limit is not enough: a thousand of them would fill the disk
        # the parts are spooled to before any is checked.
        self._total_bytes += len(chunk)
        if self._total_bytes > self._max_total_bytes:
            raise ApiError(413, f"an upload holds at most {self._max_total_bytes} bytes of files")
        self._digest.update(chunk)
        self.form.spool.write(chunk)

    def _keep_text(self, size: int) -> None:
        # Each field small is not enough: a form of many distinct small fields would still be
        # held whole in memory.
        self._field_bytes += size
        if self._field_bytes > MAX_FIELD_BYTES:
            raise ApiError(413, f"a form's text fields hold at most {MAX_FIELD_BYTES} bytes")

    def part_end(self) -> None:
        if self._file is not None:
            self._file.sha256 = self._digest.hexdigest()
        else:
            self.form.fields[self._name] = self._text.decode("utf-8", "replace")


async def receive_form(
    content_type: str | None,
    body: AsyncIterator[bytes],
    *,
    max_file_bytes: int,
    max_total_bytes: int,
    max_files: int = 1_000,
) -> ReceivedForm:
    """Parse a multipart/form-data body; file parts go to temporary files.

    Raises:
        ApiError: 415 when not multipart, 413 when a file exceeds `max_file_bytes` or the
            files together `max_total_bytes`, 422 when malformed.
    """
    mime, params = parse_options_header(content_type)
    if mime != b"multipart/form-data" or b"boundary" not in params:
        raise ApiError(415, "send the files as multipart/form-data")
    handler = _FormParser(max_file_bytes, max_files, max_total_bytes)
    try:
        # Inside: the parser refuses some boundaries (over 256 bytes) as it is made.
        parser = MultipartParser(params[b"boundary"], handler.callbacks())
        async for chunk in body:
            parser.write(chunk)
        parser.finalize()
    except ApiError:
        handler.form.close()
        raise
    except Exception as exc:
        handler.form.close()
        raise ApiError(422, f"the multipart body is malformed: {exc}") from exc
    if parser.state != MultipartState.END:
        # finalize() does not check that the closing boundary came: a body cut off between
        # two parts would otherwise store the parts before the cut as if they were all.
        handler.form.close()
        raise ApiError(422, "the multipart body ends before its closing boundary")
    return handler.form
