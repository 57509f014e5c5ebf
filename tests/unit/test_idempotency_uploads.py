"""An upload's fingerprint is taken as it streams, whatever chunks it comes in, and leaves
out its multipart boundary (a client draws a new one for each request)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from starlette.types import Message

from suzumio.gateway.api.idempotency import _StreamedBody

PATH = b"/v1/projects/p/artifacts?"


def body(boundary: bytes, content: bytes) -> bytes:
    return (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
        + content + b"\r\n--" + boundary + b"--\r\n"
    )  # fmt: skip


def digest(data: bytes, cuts: list[int], boundary: bytes) -> str | None:
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    messages: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> Message:
        return messages.pop(0)

    async def read() -> str | None:
        streamed = _StreamedBody(PATH, b"multipart/form-data; boundary=" + boundary, receive)
        for _ in range(len(chunks)):
            await streamed.receive()
        return streamed.seen()

    return asyncio.run(read())


@given(
    content=st.binary(max_size=200),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    other_cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_the_same_files_under_another_boundary_and_other_chunks_are_the_same_request(
    content: bytes, cuts: list[int], other_cuts: list[int]
) -> None:
    first = digest(body(b"b0undary1111", content), cuts, b"b0undary1111")
    again = digest(body(b"OTHERb0undary22", content), other_cuts, b"OTHERb0undary22")
    assert first is not None
    assert first == again


@given(a=st.binary(min_size=1, max_size=64), b=st.binary(min_size=1, max_size=64))
def test_other_files_are_another_request(a: bytes, b: bytes) -> None:
    if a != b:
        assert digest(body(b"bnd", a), [], b"bnd") != digest(body(b"bnd", b), [], b"bnd")


def test_an_upload_not_read_to_its_end_has_no_fingerprint() -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b"--x\r\n", "more_body": True}

    async def read() -> str | None:
        streamed = _StreamedBody(PATH, b'multipart/form-data; boundary="x"', receive)
        await streamed.receive()
        return streamed.seen()

    assert asyncio.run(read()) is None
