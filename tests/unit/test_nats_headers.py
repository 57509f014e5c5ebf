"""The platform's NATS clients parse a message's header block as nats-py does, faster
(`suzumio.contracts.nats_headers`): the same dict for any block, held to nats-py's own parser
on generated ones and on the header blocks the platform's messages carry."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NatsPyClient

from suzumio.contracts.nats_headers import parse_header_block
from suzumio.platform.bus.connection import Client as PlatformClient
from suzumio.runner.nats_client import Client as WorkerClient

nats_py = NatsPyClient._parse_header_lines

# Whitespace, colons, line ends, non-ASCII and invalid UTF-8 are what the parser decides on.
PIECES = st.sampled_from(
    [b"Nats-Msg-Id", b"a", b"B", b":", b": ", b" ", b"\t", b"\x0b", b"\x1c", b"\r\n", b"\r",
     b"\n", b"\xc3\xa9", b"\xff", b"\xe2\x80\x83", b"value", b"1", b"x-y"]
)  # fmt: skip


@settings(max_examples=3000)
@given(st.lists(PIECES, max_size=30).map(b"".join))
def test_any_block_parses_as_nats_py_parses_it(raw: bytes) -> None:
    assert parse_header_block(raw) == nats_py(raw)


@given(st.binary(max_size=200))
def test_any_bytes_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert parse_header_block(raw) == nats_py(raw)


def test_an_event_header_block_parses_whole() -> None:
    raw = (
        b"Nats-Msg-Id: 0193b5a2-1111-7abc-9def-0123456789ab\r\n"
        b"Suzumio-Types: session.message_appended\r\n"
        b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
        b"Bad Name: skipped\r\n"
        b"\x1cSep: skipped (whitespace to str, not to bytes.strip)\r\n"
        b"Caf\xc3\xa9: skipped\r\n"
        b"Note: caf\xc3\xa9 \xff\r\n\r\n"
    )
    assert (
        parse_header_block(raw)
        == nats_py(raw)
        == {
            "Nats-Msg-Id": "0193b5a2-1111-7abc-9def-0123456789ab",
            "Suzumio-Types": "session.message_appended",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "Note": "café \ufffd",
        }
    )


def test_the_platform_and_worker_clients_parse_with_it() -> None:
    assert PlatformClient._parse_header_lines is parse_header_block
    assert WorkerClient._parse_header_lines is parse_header_block
