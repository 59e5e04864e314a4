"""Parts that other apps add to a booking's page: its usage today; energy, environments, Slurm later.

The page lives here, in reservations, and apps above it (accounting, ...) know things about a
booking that reservations must not import (layers point down). So each of them registers a part
(kernel/page_parts.py) in its ``AppConfig.ready()``:

    booking_page_parts.register(Part(name="usage", title="Usage so far",
                                     template="accounting/reservation_usage.html", read=reservation_usage))

``read(reservation=..., viewer=..., now=...)`` returns the template's context, or None to leave the
part out for this booking. The viewer is always the booking's holder or an admin (the page shows
nothing to anyone else), so a part need not check that again. The page draws each in a section of
its own, titled, after its own sections.
"""

from __future__ import annotations

from kernel.page_parts import PageParts

booking_page_parts = PageParts("booking page")
