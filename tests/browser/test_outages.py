"""Pages while a dependency is away (issue 37, kernel/outages.py, live/outages.py), in Chromium against the real
server: during a database outage a page is the maintenance page (503, its words, accessible), and comes back by
its "Try again" link once the database answers; the calendar says its live updates are paused while Redis is away,
reconnects by itself when Redis is back, and shows a booking made after that without a reload."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import requests
from django.db import connection
from playwright.sync_api import expect

from tests.browser.accessibility import assert_accessible
from tests.browser.helpers import open_calendar, open_tomorrow, save_screenshot, tomorrow_at
from tests.live.server import ROOT, AsgiServer
from tests.nodes.broker_redis import AclRedis
from tests.outages.postgres import LocalPostgres
from tests.outages.traffic import prepare_database

PAUSED = "Live updates are paused while the portal waits for Redis."


def test_a_page_during_a_database_outage_is_the_maintenance_page_and_comes_back(page, screenshot, settings):
    cluster = LocalPostgres()
    static_root = tempfile.mkdtemp(prefix="gpbt-static-")
    server = None
    try:
        seed = prepare_database(DATABASE_URL=cluster.url, REDIS_URL=settings.REDIS_URL)
        # Production serves collected static files (DEBUG off: the maintenance page is handler500's there).
        environment = {**os.environ, "DATABASE_URL": cluster.url, "STATIC_ROOT": static_root}
        command = [sys.executable, "manage.py", "collectstatic", "--no-input", "-v", "0"]
        subprocess.run(command, cwd=ROOT, env=environment, check=True, timeout=300)  # noqa: S603
        server = AsgiServer(DATABASE_URL=cluster.url, DEBUG="0", STATIC_ROOT=static_root)
        server.start()
        page.context.add_cookies([{"name": "sessionid", "value": seed["sessions"][0], "url": server.url}])
        page.goto(f"{server.url}/")
        expect(page.locator("#calendar")).to_be_visible()

        cluster.stop()
        response = page.reload()
        assert response is not None and response.status == 503
        assert response.headers["retry-after"].isdigit()
        expect(page.get_by_role("heading", name="Back in a moment")).to_be_visible()
        expect(page.get_by_role("alert")).to_have_text(
            "The database is not answering (it may be restarting); try again in a few seconds."
        )
        assert_accessible(page)
        screenshot("maintenance")

        cluster.start()
        cluster.wait_until_answering()
        page.get_by_role("link", name="Try again").click()
        expect(page.locator("#calendar")).to_be_visible()
        expect(page.locator("#live-state")).to_have_text("Live")
    finally:
        if server is not None:
            server.stop()
        cluster.destroy()
        shutil.rmtree(static_root, ignore_errors=True)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the server shares the test database")
def test_the_calendar_says_live_updates_are_paused_while_redis_is_away_and_reconnects(browser, live_lab, request):
    redis = AclRedis(database=0)
    server = AsgiServer(REDIS_URL=redis.url)
    try:
        server.start()
        page = open_calendar(browser, server, live_lab["researcher"])
        open_tomorrow(page)
        page.evaluate("window.loadedOnce = true")  # gone if the page reloaded
        state = page.locator("#live-state")

        redis.stop()
        expect(state).to_have_attribute("data-state", "reconnecting")
        expect(state).to_contain_text(PAUSED)
        expect(state).to_contain_text("Reconnecting")
        save_screenshot(page, f"{request.node.originalname}-paused")

        redis.start()
        expect(state).to_have_text("Live", timeout=40_000)
        # Bookings made through the server (which broadcasts on its own Redis) show again without a reload.
        booked = requests.post(
            f"{server.url}/api/v1/reservations/",
            json={
                "gpus": [live_lab["gpus"][1].pk],
                "start": tomorrow_at(10).isoformat(),
                "end": tomorrow_at(12).isoformat(),
            },
            headers={"Authorization": f"Bearer {live_lab['admin_token']}"},
            timeout=30,
        )
        assert booked.status_code == 201, booked.text
        expect(page.locator(f'.run-blocks .block[data-reservation-id="{booked.json()["id"]}"]')).to_have_text(
            "10:00 adam"
        )
        assert page.evaluate("window.loadedOnce") is True
        save_screenshot(page, f"{request.node.originalname}-back")
    finally:
        server.stop()
        redis.stop()
