"""How the command line shows times and tables: in this machine's zone, in aligned columns."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any


def local(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    try:
        return moment.astimezone()
    except (OverflowError, ValueError, OSError):  # at the calendar's edge: shown with its own offset
        return moment


def fmt_moment(value: str | None) -> str:
    if not value:
        return "-"
    return local(value).strftime("%Y-%m-%d %H:%M %Z")


def fmt_period(start: str, end: str) -> str:
    first, last = local(start), local(end)
    if first.date() == last.date():
        return f"{first:%Y-%m-%d %H:%M}–{last:%H:%M} {last:%Z}"
    return f"{first:%Y-%m-%d %H:%M} – {last:%Y-%m-%d %H:%M} {last:%Z}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in [list(headers), *cells]) for i in range(len(headers))]
    for row in [list(headers), *cells]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
