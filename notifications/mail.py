"""Sending one templated mail: a subject, a text part and an HTML part, from templates/emails/.

``send_templated(to=[...], template="booking_confirmed", context={...})`` renders
``emails/booking_confirmed.subject.txt`` (one line), ``.txt`` and ``.html``. Every mail links back
to the portal (``portal_url`` in the context) and says how to turn that kind of mail off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string


def render_templated(template: str, context: dict[str, Any]) -> tuple[str, str, str]:
    """(subject, text, html) of ``template`` with ``context``."""
    context = {"portal_url": settings.PORTAL_URL.rstrip("/"), "site_name": settings.SITE_NAME, **context}
    subject = " ".join(render_to_string(f"emails/{template}.subject.txt", context).split())
    text = render_to_string(f"emails/{template}.txt", context)
    # The HTML part's title and first heading are the subject: a screen reader announces what the mail is first.
    html = render_to_string(f"emails/{template}.html", {**context, "subject": subject})
    return subject, text, html


def send_templated(*, to: Sequence[str], template: str, context: dict[str, Any]) -> None:
    """Send it now (callers are Celery tasks: a failure raises, and the task decides on a retry)."""
    subject, text, html = render_templated(template, context)
    message = EmailMultiAlternatives(subject, text, settings.DEFAULT_FROM_EMAIL, list(to))
    message.attach_alternative(html, "text/html")
    message.send()
