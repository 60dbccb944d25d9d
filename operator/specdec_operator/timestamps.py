"""Status stamps: the one place that writes and reads the RFC 3339 times kept in status. Pure.

Status stores wall-clock moments (a decision's time, a canary step's start, when nodes went missing) as RFC 3339
in UTC, to the second: `2026-12-03T08:40:30Z`. Every stamp the operator writes comes from `format_stamp`, and every
stamp it reads back goes through `parse_stamp`, so a stamp written by one part is always readable by another.
Where "now" comes from is not decided here: handlers/ reads the wall clock only through the injected
`OperatorContext.wall_clock` (intervals use the monotonic `OperatorContext.clock`, never a stamp).
"""

from __future__ import annotations

from datetime import UTC, datetime

STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_stamp(moment: datetime | float) -> str:
    """A moment (an aware datetime, or seconds since the epoch) as a status stamp: RFC 3339, UTC, to the second."""
    if isinstance(moment, datetime):
        return moment.astimezone(UTC).strftime(STAMP_FORMAT)
    return datetime.fromtimestamp(moment, UTC).strftime(STAMP_FORMAT)


def parse_stamp(text: str, *, assume_utc: bool = False) -> datetime:
    """An RFC 3339 stamp as an aware datetime.

    Raises ValueError naming the text when it is not a time, or (unless `assume_utc`, for inputs that are not status,
    such as a recording's lines) when it has no time zone.
    """
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        if not assume_utc:
            raise ValueError(f"{text!r} has no time zone (RFC 3339 needs one, e.g. Z)")
        moment = moment.replace(tzinfo=UTC)
    return moment


def stamp_seconds(text: str) -> float:
    """An RFC 3339 stamp as seconds since the epoch (ValueError as `parse_stamp`)."""
    return parse_stamp(text).timestamp()
