"""The profile's "Calendar feeds" section and the API for scripts: /api/v1/feeds/ and /rotate/."""

from __future__ import annotations

import html

import pytest
import yaml
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from audit.models import AuditEntry
from tests.api_helpers import client_for

from .conftest import feed_path, fetch

PROFILE = reverse("profile")
ROTATE = reverse("feeds-rotate")
API = "/api/v1/feeds/"
API_ROTATE = "/api/v1/feeds/rotate/"


def logged_in(user, **options) -> Client:
    client = Client(**options)
    client.force_login(user)
    return client


# --- the profile page -------------------------------------------------------------------------


def test_the_profile_lists_the_feed_urls_in_labelled_fields(alice, node):
    page = logged_in(alice).get(PROFILE).content.decode()

    assert '<h2 id="feeds-h" tabindex="-1">Calendar feeds</h2>' in page
    for path, label in ((feed_path(alice), "My bookings"), (feed_path(alice, node), "gpu-a100: everyone's bookings")):
        assert f'value="http://testserver{path}" readonly' in page
        assert label in page
    assert '<label for="feed-url-1">My bookings</label>' in page
    assert 'id="feed-url-1"' in page and 'id="feed-url-2"' in page
    assert "Subscribe from web" in page and "From URL" in page
    assert "Never rotated." in page
    assert f'action="{ROTATE}"' in page


def test_rotate_from_the_profile_replaces_the_urls(alice, node):
    client = logged_in(alice)
    old = feed_path(alice)

    response = client.post(ROTATE)

    assert response.status_code == 302
    assert response.url == f"{PROFILE}#feeds-h"
    assert fetch(old).status_code == 404
    new = feed_path(alice)
    assert fetch(new).status_code == 200
    page = client.get(PROFILE)
    text = html.unescape(page.content.decode())
    assert f"http://testserver{new}" in text
    assert f"http://testserver{old}" not in text
    assert "Last rotated" in text
    assert any("New calendar feed URLs" in str(m) for m in page.context["messages"])
    entry = AuditEntry.objects.get(action="feed_urls.rotate")
    assert (entry.actor, entry.before, entry.after) == (alice, {"generation": 0}, {"generation": 1})


def test_rotate_needs_a_login_a_post_and_the_csrf_token(alice):
    old = feed_path(alice)
    assert Client().post(ROTATE).url.startswith(reverse("login"))
    assert logged_in(alice).get(ROTATE).status_code == 405

    strict = logged_in(alice, enforce_csrf_checks=True)
    assert strict.post(ROTATE).status_code == 403
    assert fetch(old).status_code == 200

    page = strict.get(PROFILE)
    token = page.context["csrf_token"]
    assert strict.post(ROTATE, {"csrfmiddlewaretoken": str(token)}).status_code == 302
    assert fetch(old).status_code == 404


# --- the API ----------------------------------------------------------------------------------


def test_the_api_lists_the_same_urls_as_the_profile(alice, node):
    response = client_for(alice).get(API)

    assert response.status_code == 200
    assert response.json() == {
        "rotated_at": None,
        "feeds": [
            {"node": None, "title": "My bookings", "url": f"http://testserver{feed_path(alice)}"},
            {
                "node": "gpu-a100",
                "title": "All bookings on gpu-a100",
                "url": f"http://testserver{feed_path(alice, node)}",
            },
        ],
    }


def test_rotate_through_the_api(alice, node, clock):
    client = client_for(alice)
    old = client.get(API).json()["feeds"]

    response = client.post(API_ROTATE)

    assert response.status_code == 200
    body = response.json()
    assert body["rotated_at"] == "2030-01-07T09:00:00Z"
    assert [feed["url"] for feed in body["feeds"]] == [
        f"http://testserver{feed_path(alice)}",
        f"http://testserver{feed_path(alice, node)}",
    ]
    for feed in old:
        assert fetch(feed["url"].removeprefix("http://testserver")).status_code == 404
    for feed in body["feeds"]:
        assert fetch(feed["url"].removeprefix("http://testserver")).status_code == 200


def test_the_api_needs_authentication_and_speaks_the_error_format(alice):
    for response in (APIClient().get(API), APIClient().post(API_ROTATE)):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "not_authenticated"
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer gpb_nope")
    assert bad.get(API).json()["error"]["code"] == "authentication_failed"
    assert client_for(alice).get(API_ROTATE).status_code == 405


def test_a_session_needs_the_csrf_token_to_rotate_through_the_api(alice):
    old = feed_path(alice)
    session = APIClient(enforce_csrf_checks=True)
    session.force_login(alice)
    response = session.post(API_ROTATE)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert fetch(old).status_code == 200


def test_the_schema_describes_the_feed_endpoints(alice):
    response = client_for(alice).get("/api/schema/")
    schema = yaml.safe_load(response.content)
    listing = schema["paths"]["/api/v1/feeds/"]["get"]
    rotate = schema["paths"]["/api/v1/feeds/rotate/"]["post"]
    assert listing["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/Feeds")
    assert rotate["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/Feeds")
    assert "401" in listing["responses"] and "401" in rotate["responses"]
    feed = schema["components"]["schemas"]["Feed"]
    assert feed["properties"]["node"]["nullable"] is True
    assert set(feed["required"]) == {"node", "title", "url"}


@pytest.mark.parametrize("user", ["alice", "carol"])
def test_every_user_gets_every_nodes_feed(request, user, node):
    person = request.getfixturevalue(user)
    assert [feed["node"] for feed in client_for(person).get(API).json()["feeds"]] == [None, "gpu-a100"]
