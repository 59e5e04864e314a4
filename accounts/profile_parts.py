"""Sections that apps above accounts add to the profile page (calendar feeds today).

The profile page lives here, in accounts, the layer under almost everything; apps above it register a
part (kernel/page_parts.py) in their ``AppConfig.ready()``. ``read(request=...)`` gets the request of the
logged-in person whose profile it is and returns the template's context (None leaves the part out).
Unlike a booking page's parts, a profile part draws its own ``<section>``, with its own forms.
"""

from __future__ import annotations

from kernel.page_parts import PageParts

profile_parts = PageParts("profile page")
