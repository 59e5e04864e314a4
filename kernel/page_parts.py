"""Sections that apps higher up add to a page of a lower app, without the lower app importing them.

A page belongs to one app (a booking's page to reservations, the profile to accounts), and apps above
it know things about its subject that it must not import (layers point down: docs/architecture.md).
So the page keeps a ``PageParts`` registry, and each of those apps registers a part in its
``AppConfig.ready()``: a name (the section's id), a title, a template, and a function that reads what
the template shows, given what the page passes (``read(**context)``; None leaves the part out). The
page draws the parts in ``order``, with any stylesheets and scripts they need.

    booking_parts = PageParts("booking page")          # in the page's app
    booking_parts.register(Part(name="usage", title="Usage so far",    # in the higher app's ready()
                                template="accounting/reservation_usage.html", read=reservation_usage))
    booking_parts.shown(reservation=r, viewer=user, now=now)           # in the page's view
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Reader = Callable[..., dict[str, Any] | None]


@dataclass(frozen=True)
class Part:
    name: str  # the section's id on the page (and its key in the registry)
    title: str
    template: str
    read: Reader
    order: int = 100
    stylesheets: tuple[str, ...] = ()  # static paths the part needs on the page
    scripts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShownPart:
    part: Part
    context: dict[str, Any]


class PageParts:
    def __init__(self, page: str) -> None:
        self.page = page
        self._parts: dict[str, Part] = {}

    def register(self, part: Part) -> None:
        """Add ``part`` (or replace the one of that name: ``ready()`` may run twice in tests)."""
        self._parts[part.name] = part

    def shown(self, **context: Any) -> list[ShownPart]:
        """The parts that have something to show for this ``context``, in order."""
        shown = []
        for part in sorted(self._parts.values(), key=lambda p: (p.order, p.name)):
            read = part.read(**context)
            if read is not None:
                shown.append(ShownPart(part=part, context=read))
        return shown

    def __repr__(self) -> str:
        return f"<PageParts of the {self.page}>"


def assets(shown: list[ShownPart]) -> dict[str, list[str]]:
    """The stylesheets and scripts of the shown parts, each once, for the page's <head> and end."""
    stylesheets = list(dict.fromkeys(path for s in shown for path in s.part.stylesheets))
    scripts = list(dict.fromkeys(path for s in shown for path in s.part.scripts))
    return {"stylesheets": stylesheets, "scripts": scripts}
