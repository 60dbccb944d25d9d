"""timestamps.py: the one format and parse of RFC 3339 status stamps; what one part writes another reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from specdec_operator.timestamps import format_stamp, parse_stamp, stamp_seconds


def test_a_moment_is_stamped_in_utc_to_the_second_from_seconds_or_a_datetime() -> None:
    assert format_stamp(1_764_750_030.9) == "2025-12-03T08:20:30Z"
    plus_two = datetime(2025, 12, 3, 10, 20, 30, 500_000, tzinfo=timezone(timedelta(hours=2)))
    assert format_stamp(plus_two) == "2025-12-03T08:20:30Z"


def test_a_stamp_reads_back_as_the_moment_it_was_written_from() -> None:
    stamp = format_stamp(1_764_750_030)
    assert parse_stamp(stamp) == datetime(2025, 12, 3, 8, 20, 30, tzinfo=UTC)
    assert stamp_seconds(stamp) == 1_764_750_030
    assert parse_stamp("2025-12-03T09:20:30+01:00") == parse_stamp(stamp)


@pytest.mark.parametrize(("text", "words"), [
    ("yesterday", "is not an RFC 3339 time"),
    ("2025-12-03T08:20:30", "has no time zone"),
])
def test_an_unreadable_or_zoneless_stamp_is_refused_naming_it(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as raised:
        parse_stamp(text)
    assert repr(text) in str(raised.value)


def test_a_zoneless_time_may_be_taken_as_utc_where_the_input_is_not_status() -> None:
    assert parse_stamp("2025-12-03T08:20:30", assume_utc=True) == datetime(2025, 12, 3, 8, 20, 30, tzinfo=UTC)
