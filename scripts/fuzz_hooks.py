"""Schemathesis hooks for scripts/fuzz-api: date-times at the edges of the calendar.

Schemathesis draws a ``format: date-time`` value from the whole RFC 3339 range (years 0001-9999,
offsets up to ±23:59), but its draws cluster on ordinary dates: in a minute of fuzzing it never sent
a booking ending 9999-12-31T23:59Z, an extension to 9999-12-31T23:59:59Z or availability after
9999-12-30, each of which answered 500 until the portal kept to its calendar (kernel/fields.py,
issue 14). This module replaces the strategy for every date-time parameter and body field of the
schema with one that mixes such values in: the last and first minutes datetime can hold, far-future
and far-past times, offsets no zone has (+23:59, -23:59, +14:01) and offsets the parser refuses
(+24:00, +99:00), besides ordinary times near today so that requests still get past validation.

A date-time only reaches the arithmetic that overflowed once the rest of the request is right, which
random bodies and ids seldom are (a booking needs a GPU that exists, an extension a reservation of
the caller's). So half of the bookings get one of the lab's GPUs and a start in the next two days,
and half of the requests to ``/reservations/{id}/...`` one of the caller's reservations: the ids
scripts/fuzz-api passes in FUZZ_GPU_IDS and FUZZ_RESERVATION_IDS.

scripts/fuzz-api loads it with ``SCHEMATHESIS_HOOKS=scripts/fuzz_hooks.py``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import schemathesis
from hypothesis import strategies as st

# The inputs that answered 500, and their neighbours at both ends of datetime's range.
EDGE_TIMES = (
    "9999-12-31T23:59:00Z",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59.999999Z",
    "9999-12-31T23:59:59-23:59",
    "9999-12-31T00:00:00+14:00",
    "9999-12-30T00:00:00Z",
    "9999-01-01T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+23:59",
    "0001-01-01T00:00:00-05:00",
    "0001-01-02T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "2030-01-07T12:00:00+23:59",
    "2030-01-07T12:00:00-23:59",
    "2030-01-07T12:00:00+14:01",
    "2030-01-07T12:00:00-12:01",
    "2030-01-07T12:00:00+24:00",
    "2030-01-07T12:00:00+99:00",
)


def _offset(minutes: int) -> str:
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


# Every offset Python can parse (strictly inside ±24:00), the extremes most often.
OFFSETS = st.one_of(
    st.sampled_from(["Z", "+00:00", "+23:59", "-23:59", "+14:00", "-12:00"]),
    st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(_offset),
)
FAR_FUTURE = st.datetimes(min_value=datetime(9990, 1, 1), max_value=datetime.max)
FAR_PAST = st.datetimes(min_value=datetime.min, max_value=datetime(10, 12, 31))
# Around the portal's "now" (and the tests' 2030), so that bookings and reports still happen.
ORDINARY = st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2035, 12, 31))


def _with_offset(moment: datetime, offset: str) -> str:
    return f"{moment.isoformat()}{offset}"


EDGES = st.sampled_from(EDGE_TIMES) | st.builds(_with_offset, FAR_FUTURE | FAR_PAST, OFFSETS)
# Half edges, half ordinary times.
DATE_TIMES = EDGES | st.builds(_with_offset, ORDINARY, OFFSETS)

schemathesis.openapi.format("date-time", DATE_TIMES)


def _ids(name: str) -> list[int]:
    return [int(part) for part in os.environ.get(name, "").split(",") if part.strip()]


GPU_IDS = _ids("FUZZ_GPU_IDS")
RESERVATION_IDS = _ids("FUZZ_RESERVATION_IDS")


def _label(context: Any) -> str:
    return context.operation.label if context.operation is not None else ""


def _bookable(body: dict[str, Any], gpu: int, hours_ahead: int, end: str | None) -> dict[str, Any]:
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=hours_ahead)
    rest = {key: value for key, value in body.items() if key not in ("node", "gpu_count")}
    return {**rest, "gpus": [gpu], "start": start.isoformat(), **({"end": end} if end else {})}


@schemathesis.hook
def flatmap_body(context: Any, body: Any) -> st.SearchStrategy:
    label = _label(context)
    if not isinstance(body, dict):
        return st.just(body)
    if label == "POST /api/v1/reservations/" and GPU_IDS:
        # The end is what this is about: the drawn one, or an edge time (a later check, such as a
        # slot already taken, could otherwise answer before the arithmetic that overflows runs).
        bookable = st.builds(_bookable, st.just(body), st.sampled_from(GPU_IDS), st.integers(1, 48), st.none() | EDGES)
        return st.just(body) | bookable
    if label == "POST /api/v1/reservations/{id}/extend/":
        return st.just(body) | EDGES.map(lambda end: {**body, "end": end})
    return st.just(body)


@schemathesis.hook
def flatmap_path_parameters(context: Any, path_parameters: Any) -> st.SearchStrategy:
    if not _label(context).startswith("POST /api/v1/reservations/{id}/") or not RESERVATION_IDS:
        return st.just(path_parameters)
    if not isinstance(path_parameters, dict) or "id" not in path_parameters:
        return st.just(path_parameters)
    own = st.sampled_from(RESERVATION_IDS).map(lambda pk: {**path_parameters, "id": pk})
    return st.just(path_parameters) | own
