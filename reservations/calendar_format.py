"""How the calendar writes GPUs and times: labels and the ISO 8601 forms EventCalendar reads.

Pure functions, no queries: used by the calendar's reads (reservations/calendar_data.py), its page
and endpoint, and by a booking's own page.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from nodes.models import mib_to_gb

# "NVIDIA A100-SXM4-80GB" -> "A100-SXM4": the memory is shown on its own, from memory_mib.
_VENDOR_PREFIX = re.compile(r"^NVIDIA\s+", re.IGNORECASE)
_MEMORY_SUFFIX = re.compile(r"[-\s]*\d+\s*GB\b.*$", re.IGNORECASE)


def gpu_label(index: int, model: str, memory_mib: int) -> str:
    """'GPU 0 · A100-SXM4 80 GB'; without the size where it is not known (0: a Slurm node's GPUs are counted)."""
    short = _MEMORY_SUFFIX.sub("", _VENDOR_PREFIX.sub("", model.strip())) or model.strip()
    return f"GPU {index} · {short} {mib_to_gb(memory_mib)} GB" if memory_mib else f"GPU {index} · {short}"


def utc_offset(zone_name: str, moment: datetime) -> str:
    """The offset of ``zone_name`` at ``moment`` as EventCalendar wants it: '+01:00', '-05:30'."""
    offset = moment.astimezone(ZoneInfo(zone_name)).utcoffset() or timedelta(0)
    minutes = round(offset.total_seconds() / 60)
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


def iso_utc(moment: datetime) -> str:
    # Always "+00:00", never "Z": EventCalendar reads an offset only in the ±HH:MM form and would
    # take a "Z" time as wall-clock time in the calendar's zone.
    return moment.astimezone(UTC).isoformat()


def iso_from_text(text: str) -> str:
    """'2030-01-07 10:00:00+00' (PostgreSQL in UTC) or '2030-01-07 10:00:00' (SQLite, UTC) -> ISO 8601."""
    if len(text) == 19 or (len(text) == 22 and text.endswith("+00")):
        return f"{text[:10]}T{text[11:19]}+00:00"
    moment = datetime.fromisoformat(text)
    return iso_utc(moment if moment.tzinfo else moment.replace(tzinfo=UTC))
