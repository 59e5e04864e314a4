"""Where people see fair share: their own on the profile and in /api/v1/me/, everyone's for admins and
/metrics; and the optional cap on how far ahead someone far over their share may book."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from reservations.exceptions import LimitExceeded
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import book
from tests.metrics.conftest import scrape, value  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def history(alice, bob, carol, gpus):
    """alice used 10 GPU-hours in the last day; bob and carol nothing. Nobody is in a group: a third each."""
    book(alice, [gpus[0]], at(-10), at(0), direct=True)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_profile_shows_your_own_factor_and_why(history, alice, bob):
    html = logged_in(alice).get("/profile/").content.decode()
    assert "Your fair-share factor is <strong>0.13</strong>" in html  # 2^(-1 / (1/3)) = 0.125
    assert "group (no group), 1 of 1 shares split between 3" in html
    assert "Each hour counts half after 7 days" in html
    assert "Your fair-share factor is <strong>1.00</strong>" in logged_in(bob).get("/profile/").content.decode()


def test_me_gives_your_factor_only(history, alice):
    mine = client_for(alice).get("/api/v1/me/").json()["fair_share"]
    assert mine["factor"] == pytest.approx(0.125, abs=1e-3)
    assert (round(mine["usage"], 3), round(mine["share"], 3)) == (1.0, 0.333)
    # 10 hours up to now, each decayed by its age: 168 / ln 2 x (1 - 2^(-10/168)) = 9.80.
    assert mine["booked_gpu_hours"] == pytest.approx(9.7965, abs=1e-3)
    assert mine["groups"] == [{"name": "(no group)", "shares": 1, "total_shares": 1, "members": 3}]
    assert "Factor 2^(-1.000 / 0.333) = 0.12." in mine["explanation"]


def test_everyones_table_is_for_admins(history, alice, carol):
    assert logged_in(alice).get("/fairshare/").status_code == 403
    html = logged_in(carol).get("/fairshare/").content.decode()
    assert html.index(">alice<") < html.index(">bob<")  # lowest factor first
    assert "0.125" in html


def test_metrics_export_every_factor(history, scrape):  # noqa: F811
    text = scrape()
    assert value(text, "gpubook_fairshare_factor", user="alice") == pytest.approx(0.125, abs=1e-3)
    assert value(text, "gpubook_fairshare_factor", user="bob") == 1.0
    assert value(text, "gpubook_fairshare_share", user="carol") == pytest.approx(1 / 3)
    assert value(text, "gpubook_waitlist_entries", state="waiting") == 0


def test_the_horizon_cap_is_off_by_default_and_says_why_when_on(history, alice, bob, gpus, settings):
    far = (at(0) + timedelta(days=3), at(0) + timedelta(days=3, hours=1))
    reservation_create(user=alice, gpus=[gpus[1]], start=far[0], end=far[1])  # off: allowed

    settings.FAIRSHARE_HORIZON_CAP = True
    with pytest.raises(LimitExceeded) as refused:
        reservation_create(user=alice, gpus=[gpus[2]], start=far[0], end=far[1])
    assert "> 2 allowed (fair share: your factor 0.12 is under 0.25)" in str(refused.value)
    reservation_create(user=alice, gpus=[gpus[2]], start=at(1), end=at(2))  # within two days: fine
    reservation_create(user=bob, gpus=[gpus[3]], start=far[0], end=far[1])  # bob is under his share
    assert client_for(alice).get("/api/v1/me/").json()["max_days_ahead"] == 2


def test_a_researcher_sees_only_their_own_factor(history, alice, bob):
    mine = client_for(bob).get("/api/v1/me/").json()["fair_share"]
    assert (mine["factor"], mine["usage"], mine["booked_gpu_hours"]) == (1.0, 0.0, 0.0)  # bob's, not alice's
    assert "alice" not in str(mine)
    profile = logged_in(bob).get("/profile/").content.decode()
    assert "0.13" not in profile and 'href="/fairshare/"' not in profile  # no menu link to everyone's


def test_the_table_is_in_the_admins_menu_and_closed_to_strangers(history, carol):
    assert 'href="/fairshare/"' in logged_in(carol).get("/profile/").content.decode()
    response = Client().get("/fairshare/")
    assert response.status_code == 302 and "/login" in response["Location"]


def test_the_me_schema_describes_fair_share(db):
    schema = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert "fair_share" in schema.content.decode() and "2^(-usage/share)" in schema.content.decode()
