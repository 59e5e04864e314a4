"""The portal's URLs plus views that meet a fault on purpose, for tests/outages/test_mapping.py."""

from __future__ import annotations

import psycopg
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import path, re_path

from portal import urls as portal_urls
from reservations.models import Reservation

# What the next request to a faulty view raises (set by the test), and how often each view ran.
fault: dict[str, BaseException | None] = {"error": None}
calls: dict[str, int] = {}
# What the next renders of ``rendered_later``'s page raise, one each, first first.
failing_renders: list[BaseException] = []


def faulty(request: HttpRequest, name: str) -> HttpResponse:
    calls[name] = calls.get(name, 0) + 1
    error = fault["error"]
    if error is not None:
        raise error
    return JsonResponse({"ok": True})


def rendered_later(request: HttpRequest, name: str) -> HttpResponse:
    """A lazy response, as the admin's pages, LoginView and DRF return: Django renders it after the view, and
    reading ``value`` then raises the next of ``failing_renders``, as a query made while rendering would."""
    calls[name] = calls.get(name, 0) + 1

    def value() -> str:
        if failing_renders:
            raise failing_renders.pop(0)
        return "rendered"

    return TemplateResponse(request, engines["django"].from_string("<p>{{ value }}</p>"), {"value": value})


def breaks_its_connection_once(request: HttpRequest) -> HttpResponse:
    """Reads, has PostgreSQL end its own session (as a fast shutdown does), and reads again: the second read
    meets the broken connection. Only the first call breaks it."""
    calls["breaks"] = calls.get("breaks", 0) + 1
    Reservation.objects.count()
    if calls["breaks"] == 1:
        pid = connection.connection.info.backend_pid
        db = connection.settings_dict
        with psycopg.connect(
            dbname=db["NAME"],
            user=db["USER"],
            password=db["PASSWORD"],
            host=db["HOST"] or "127.0.0.1",
            port=db["PORT"] or 5432,
            autocommit=True,
        ) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
    return JsonResponse({"reservations": Reservation.objects.count(), "calls": calls["breaks"]})


urlpatterns = [
    path("api/v1/test-fault/<str:name>/", faulty),
    path("test-fault/<str:name>/", faulty),
    path("test-rendered-later/<str:name>/", rendered_later),
    # A path that begins with "//" or "/\" (GET //evil.example/): what is left after the resolver's own "/".
    re_path(r"^[/\\](?P<name>.*)$", faulty),
    path("api/v1/test-broken-connection/", breaks_its_connection_once),
    *portal_urls.urlpatterns,
]

handler400 = portal_urls.handler400
handler404 = portal_urls.handler404
handler500 = portal_urls.handler500
