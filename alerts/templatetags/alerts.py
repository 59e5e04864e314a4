"""``{% open_alerts_data as alerts %}``: the open alerts for the admins' status page panel (the
page's own view stays in live/pages.py; the panel then follows the websocket topic "alerts")."""

from __future__ import annotations

from typing import Any

from django import template

from alerts import selectors

register = template.Library()


@register.simple_tag(takes_context=True)
def open_alerts_data(context: dict[str, Any]) -> list[dict[str, Any]]:
    user = context["request"].user
    if not getattr(user, "is_booking_admin", False):
        return []
    return selectors.open_alerts_data()
