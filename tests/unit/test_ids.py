from __future__ import annotations

import time
import uuid

import pytest

from suzumio.contracts.ids import is_valid_id, new_id, uuid7


def test_new_ids_are_uuid7_in_creation_order() -> None:
    ids = [new_id() for _ in range(5_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert str(parsed) == ids[0]


def test_uuid7_carries_the_time_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= value.int >> 80 <= after + 1


@pytest.mark.parametrize("value", ["abc", "A-1_b", "0190a000-0000-7000-8000-000000000001"])
def test_valid_ids(value: str) -> None:
    assert is_valid_id(value)


@pytest.mark.parametrize("value", ["", "a.b", "a*", "a>", "a b", "-lead", "x" * 65, "ü"])
def test_ids_that_would_break_subjects_are_refused(value: str) -> None:
    assert not is_valid_id(value)
