"""Request types for the views only a signed-in person reaches.

``@login_required`` pages and API views behind ``IsAuthenticated`` (the API's default permission) see a
portal account in ``request.user``, never the anonymous user; annotating their ``request`` with these
types says so to mypy (django-stubs' recommended way). They are for annotations only: Django and DRF
build the usual request objects.
"""

from __future__ import annotations

from django.http import HttpRequest
from rest_framework.request import Request

from accounts.models import User


class AuthenticatedHttpRequest(HttpRequest):
    user: User


class AuthenticatedRequest(Request):
    user: User
