"""The Content-Security-Policy (kernel/csp.py, CONTENT_SECURITY_POLICY in portal/settings.py): every response of every
route carries it, with scripts and styles from the portal only, no inline script or eval anywhere, the page's own
websocket origin, and nothing of it loosened but the styles of DRF's browsable pages; and no template of the portal's
holds what the policy would refuse. The browser tests check that nothing is refused in Chromium
(tests/browser/test_console.py, and conftest.py's no_csp_violation for every browser test)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib import admin
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from reservations.series import series_create
from tests.conftest import at
from tests.factories import book

STRICT = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'", "ws://testserver"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}


def policy_of(response) -> dict[str, list[str]]:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"{response.status_code} {response.request['PATH_INFO']} has no Content-Security-Policy"
    directives = [part.split() for part in header.split(";") if part.strip()]
    return {name: values for name, *values in directives}


def plain_routes(patterns=None, prefix: str = "") -> list[str]:
    """Every route of the portal's URLconf that takes no argument, as a path (admin's are listed apart)."""
    found = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = str(entry.pattern)
        if route.startswith("admin/") or "<" in route:
            continue
        if isinstance(entry, URLResolver):
            found += plain_routes(entry.url_patterns, prefix + route)
        elif isinstance(entry, URLPattern) and not route.startswith("^"):
            found.append("/" + prefix + route)
    return found


def admin_pages() -> list[str]:
    pages = [reverse("admin:index")]
    for model in admin.site._registry:
        meta = model._meta
        pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_add"))
    return pages


@pytest.fixture
def lab(carol, alice, gpus, clock):
    booking = book(alice, gpus[:1], at(1), at(3), purpose="training")
    series = series_create(
        user=alice, gpus=[gpus[1]], start=at(1), end=at(3), rule="FREQ=WEEKLY;COUNT=2", zone="UTC", mode="skip"
    ).series
    return {"booking": booking, "series": series}


def test_every_route_and_admin_page_answers_with_the_strict_policy(client, carol, lab):
    client.force_login(carol)
    paths = [
        *plain_routes(),
        *admin_pages(),
        f"/reservations/{lab['booking'].pk}/",
        f"/series/{lab['series'].pk}/",
        f"/admin/reservations/reservation/{lab['booking'].pk}/change/",
        "/api/docs/?script=",  # Swagger UI's start-up script, served apart from its page
        "/api/v1/reservations/",  # JSON, as a script asks for it
        "/no-such-page/",
        "/api/v1/no-such-thing/",
    ]
    assert len(paths) > 60  # the resolver and the admin were read, not an empty list
    answered = {}
    for path in paths:
        response = client.get(path)
        answered[path] = response.status_code
        assert policy_of(response) == STRICT, path
    assert answered["/reservations/pending/"] == 200
    assert answered["/admin/reservations/limit/add/"] == 200
    assert answered["/no-such-page/"] == 404


def test_pages_a_researcher_may_not_open_and_the_login_carry_it_too(client, alice, lab):
    assert policy_of(client.get("/accounts/login/")) == STRICT
    assert policy_of(client.get("/reservations/mine/")) == STRICT  # the redirect to the login
    client.force_login(alice)
    for path in ["/reservations/pending/", "/admin/", "/fairshare/"]:
        response = client.get(path)
        assert response.status_code in (302, 403), path
        assert policy_of(response) == STRICT, path


def test_over_https_the_live_updates_may_use_wss_to_the_same_host(client, alice, settings):
    settings.ALLOWED_HOSTS = ["portal.example.org"]
    response = client.get("/accounts/login/", secure=True, HTTP_HOST="portal.example.org")
    assert policy_of(response)["connect-src"] == ["'self'", "wss://portal.example.org"]


def test_a_host_the_portal_does_not_serve_adds_no_origin(client, settings):
    settings.ALLOWED_HOSTS = ["portal.example.org"]
    response = client.get("/accounts/login/", HTTP_HOST="evil.example.com")
    assert response.status_code == 400
    assert policy_of(response)["connect-src"] == ["'self'"]


def test_drfs_browsable_pages_may_style_inline_but_never_script(client, alice):
    client.force_login(alice)
    response = client.get("/api/v1/reservations/", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert policy_of(response) == STRICT | {"style-src": ["'self'", "'unsafe-inline'"]}


def test_swagger_ui_is_served_without_an_inline_script_or_style(client, alice):
    client.force_login(alice)
    page = client.get("/api/docs/").content.decode()
    assert re.findall(r"<script[^>]*>", page) == [
        f'<script src="{settings.STATIC_URL}drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js">',
        f'<script src="{settings.STATIC_URL}drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-standalone-preset.js">',
        '<script src="/api/docs/?script=">',
    ]
    assert "<style" not in page
    script = client.get("/api/docs/?script=")
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle(" in script.content.decode()


# --- the templates -------------------------------------------------------------------------------

TEMPLATES = Path(settings.BASE_DIR) / "templates"
# What the policy refuses in a page: an inline script (one with a body, or with no src), an inline <style>, a style
# attribute, an inline event handler, a javascript: URL.
REFUSED = {
    "inline script": re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE),
    "inline <style>": re.compile(r"<style\b", re.IGNORECASE),
    "style attribute": re.compile(r"\sstyle\s*=", re.IGNORECASE),
    "event handler attribute": re.compile(r"<[a-z][^>]*\son[a-z]+\s*=", re.IGNORECASE),
    "javascript: URL": re.compile(r"javascript:", re.IGNORECASE),
}


def page_templates() -> list[Path]:
    """The portal's page templates. Mails (templates/emails/) are left out: no page policy governs a mail, and mail
    clients read only inline styles."""
    return sorted(path for path in TEMPLATES.rglob("*.html") if "emails" not in path.relative_to(TEMPLATES).parts)


@pytest.mark.parametrize("kind", REFUSED)
def test_no_page_template_holds_what_the_policy_refuses(kind):
    templates = page_templates()
    assert len(templates) > 30
    found = [
        f"{path.relative_to(TEMPLATES)}: {match.group(0)}"
        for path in templates
        for match in REFUSED[kind].finditer(path.read_text())
    ]
    assert not found, f"{kind} in:\n" + "\n".join(found)


def test_the_template_check_finds_each_kind():
    """The control: each pattern above does match what it names (and a script with a src does not)."""
    samples = {
        "inline script": '<script>alert(1)</script> <script type="module">x()</script>',
        "inline <style>": "<style>p { color: red }</style>",
        "style attribute": '<p class="x" style="color: red">',
        "event handler attribute": '<button type="button" onclick="go()">',
        "javascript: URL": '<a href="javascript:go()">',
    }
    for kind, sample in samples.items():
        assert REFUSED[kind].search(sample), kind
    assert not REFUSED["inline script"].search('<script src="/static/js/live.js" defer></script>')
