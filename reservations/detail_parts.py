"""Parts that other apps add to a booking's page: its usage today; energy, environments, Slurm later.

The page lives here, in reservations, and apps above it (accounting, ...) know things about a
booking that reservations must not import (layers point down). So each of them registers a part in
its ``AppConfig.ready()``: a section title, a template, and a function that reads what the template
shows. The page draws the parts after its own sections, in ``order``.

    register(Part(name="usage", title="Usage so far", template="accounting/reservation_usage.html",
                  read=reservation_usage, order=100))

``read(reservation=..., viewer=..., now=...)`` returns the template's context, or None to leave the
part out for this booking. The viewer is always the booking's holder or an admin (the page shows
nothing to anyone else), so a part need not check that again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reservations.models import Reservation

Reader = Callable[..., dict[str, Any] | None]


@dataclass(frozen=True)
class Part:
    name: str  # the section's id on the page (and its key here)
    title: str
    template: str
    read: Reader
    order: int = 100


@dataclass(frozen=True)
class ShownPart:
    part: Part
    context: dict[str, Any]


_PARTS: dict[str, Part] = {}


def register(part: Part) -> None:
    """Add ``part`` (or replace the one of that name: ``ready()`` may run twice in tests)."""
    _PARTS[part.name] = part


def parts_for(*, reservation: Reservation, viewer: Any, now: datetime) -> list[ShownPart]:
    shown = []
    for part in sorted(_PARTS.values(), key=lambda p: (p.order, p.name)):
        context = part.read(reservation=reservation, viewer=viewer, now=now)
        if context is not None:
            shown.append(ShownPart(part=part, context=context))
    return shown
