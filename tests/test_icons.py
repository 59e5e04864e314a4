"""Every page names icons that exist, and /favicon.ico (which browsers ask for on pages that name none:
the API's browsable pages, error pages) leads to one rather than a 404. Browser tests cannot see this:
Chromium's favicon requests never reach Playwright's request events."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders

ICON_LINK = re.compile(r'<link rel="(?:icon|apple-touch-icon|manifest)" href="([^"]+)"')


def static_file(url: str) -> Path:
    assert url.startswith(settings.STATIC_URL), url  # "/static/" once Django has prefixed it
    found = finders.find(url.removeprefix(settings.STATIC_URL))
    assert found, f"{url} names no static file"
    return Path(found)


def test_favicon_ico_leads_to_the_portals_icon(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert static_file(response["Location"]).read_text().startswith("<svg")
    assert client.post("/favicon.ico").status_code == 405


@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_the_icons_a_page_names_exist_and_so_do_the_manifests(client, db, path):
    page = client.get(path).content.decode()
    links = ICON_LINK.findall(page)
    assert len(links) == 3, page[:2000]
    for link in links:
        static_file(link)
    manifest = json.loads(static_file(next(link for link in links if "manifest" in link)).read_text())
    for icon in manifest["icons"]:
        assert finders.find(icon["src"]), icon
