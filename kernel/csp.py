"""The Content-Security-Policy header: django-csp's middleware with the two things a fixed policy cannot say.

The policy itself is ``CONTENT_SECURITY_POLICY`` in portal/settings.py. This middleware adds, per response:

- the page's own websocket origin (``ws://`` or ``wss://`` and the host asked for) to ``connect-src``. CSP Level 3
  lets ``'self'`` match the same host's websockets (Chromium does: tried with Debian's Chromium 156), but under
  CSP Level 2, which older browsers follow, ``'self'`` never matched ``ws:`` or ``wss:``, and the live updates
  would be refused there unless the origin is named. The host has passed ALLOWED_HOSTS by then, so nothing a
  client sends widens the policy beyond the hosts the portal answers to.
- ``style-src 'unsafe-inline'`` on the pages of DRF's browsable API only: its template (rest_framework/base.html)
  puts Pygments' highlighting rules in a ``<style>`` element and floats two buttons with ``style=""``
  attributes. Inline styles cannot run code, those pages escape every value they show (no HTML of anyone's gets
  in to be styled), and ``script-src`` stays as strict there as everywhere.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from rest_framework.renderers import BrowsableAPIRenderer

UNSAFE_INLINE = "'unsafe-inline'"


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        update = dict(parts.update or {})
        if origin := websocket_origin(request):
            update["connect-src"] = [*update.get("connect-src", []), origin]
        if isinstance(getattr(response, "accepted_renderer", None), BrowsableAPIRenderer):
            update["style-src"] = [*update.get("style-src", []), UNSAFE_INLINE]
        parts.update = update
        return parts


def websocket_origin(request: HttpRequest) -> str | None:
    """``wss://host[:port]`` for a page served over https, ``ws://...`` over http; None when the host is not
    one the portal serves (the response is then the 400 that says so)."""
    try:
        host = request.get_host()
    except DisallowedHost:
        return None
    return f"{'wss' if request.is_secure() else 'ws'}://{host}"
