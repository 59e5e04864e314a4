"""Who can read a feed: the URL is the key. Rotation, deactivation, forged and bad tokens, rate, caching."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from feeds.selectors import feed_links
from feeds.services import feed_urls_rotate
from feeds.tokens import feed_token
from reservations.services import reservation_create
from tests.conftest import at

from .conftest import feed_path, fetch, read_feed

pytestmark = pytest.mark.usefixtures("clock")


def assert_bare_404(response):
    assert response.status_code == 404
    assert response.content == b"Not found.\n"
    assert response["Content-Type"] == "text/plain; charset=utf-8"


def test_feed_urls_need_no_login_and_differ_per_user_and_feed(alice, bob, node):
    paths = {feed_path(alice), feed_path(alice, node), feed_path(bob), feed_path(bob, node)}
    assert len(paths) == 4
    for path in paths:
        assert path.startswith("/feeds/") and path.endswith(".ics")
        assert fetch(path).status_code == 200
    # The same URL every time the user looks (nothing to copy again until they rotate).
    assert feed_path(alice) == feed_path(alice)


def test_rotating_turns_every_old_url_into_404_and_the_new_ones_work(alice, bob, node):
    old_own, old_node, bobs = feed_path(alice), feed_path(alice, node), feed_path(bob)

    feed_urls_rotate(user=alice, actor=alice)

    assert_bare_404(fetch(old_own))
    assert_bare_404(fetch(old_node))
    new_own, new_node = feed_path(alice), feed_path(alice, node)
    assert {new_own, new_node}.isdisjoint({old_own, old_node})
    assert fetch(new_own).status_code == 200
    assert fetch(new_node).status_code == 200
    assert fetch(bobs).status_code == 200  # other people's URLs are untouched

    feed_urls_rotate(user=alice, actor=alice)
    assert_bare_404(fetch(new_own))


def test_a_deactivated_users_feeds_stop_working(alice, node):
    paths = [feed_path(alice), feed_path(alice, node)]
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    for path in paths:
        assert_bare_404(fetch(path))
    get_user_model().objects.filter(pk=alice.pk).update(is_active=True)
    assert fetch(paths[0]).status_code == 200


def test_a_token_names_one_feed_its_mac_cannot_be_moved_to_another(alice, bob, node, gpus):
    other = type(node).objects.create(name="gpu-h100", hostname="h100.lab.example")
    reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(2), purpose="secret")
    user_id, feed, mac = feed_path(alice, other).removeprefix("/feeds/").removesuffix(".ics").split(".")

    assert_bare_404(fetch(f"/feeds/{user_id}.n{node.pk}.{mac}.ics"))  # another node with this node's MAC
    assert_bare_404(fetch(f"/feeds/{user_id}.mine.{mac}.ics"))
    assert_bare_404(fetch(f"/feeds/{bob.pk}.{feed}.{mac}.ics"))  # another user's feed with alice's MAC


@pytest.mark.parametrize(
    "path",
    [
        "/feeds/nonsense.ics",
        "/feeds/1.mine.short.ics",
        "/feeds/1.mine." + "A" * 43 + ".ics",
        "/feeds/999999.mine." + "A" * 43 + ".ics",
        "/feeds/1.n999999." + "A" * 43 + ".ics",
        "/feeds/0.mine." + "A" * 43 + ".ics",
        "/feeds/1.mine." + "A" * 42 + "%.ics",
    ],
)
def test_unknown_or_malformed_tokens_are_a_bare_404(alice, path):
    assert_bare_404(fetch(path))


def test_a_valid_mac_for_a_node_that_is_gone_is_404(alice, node):
    token = feed_token(user_id=alice.pk, node_id=node.pk + 1000, generation=0)
    assert_bare_404(fetch(f"/feeds/{token}.ics"))


def test_a_token_from_another_secret_key_is_404_but_a_fallback_key_still_works(alice, settings):
    path = feed_path(alice)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "another-secret-key-for-this-test-only-0123456789"
    assert fetch(path).status_code == 200  # rotated Django's way: old URLs work until the fallback goes
    assert feed_path(alice) != path  # new URLs are made with the new key
    settings.SECRET_KEY_FALLBACKS = []
    assert_bare_404(fetch(path))


def test_the_token_is_not_stored_anywhere(alice, node):
    from feeds.models import FeedKey

    feed_urls_rotate(user=alice, actor=alice)
    mac = feed_path(alice).split(".")[2]
    key = FeedKey.objects.get(user=alice)
    assert mac not in repr(vars(key))
    assert feed_token(user_id=alice.pk, node_id=None, generation=key.generation).endswith(mac)


# --- polling --------------------------------------------------------------------------------


def test_responses_are_private_and_revalidated_with_an_etag(alice, gpus):
    path = feed_path(alice)
    first = fetch(path)
    assert first["Cache-Control"] == "private, no-cache"
    assert first["X-Robots-Tag"] == "noindex, nofollow"
    assert first["Referrer-Policy"] == "no-referrer"
    etag = first["ETag"]

    again = fetch(path, HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304
    assert again.content == b""

    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    changed = fetch(path, HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200
    assert changed["ETag"] != etag


def test_head_requests_work_and_posts_are_refused(alice):
    path = feed_path(alice)
    assert fetch(path).status_code == 200
    from django.test import Client

    assert Client().head(path).status_code == 200
    assert Client().post(path).status_code == 405


def test_each_url_has_its_own_hourly_allowance(alice, node, settings, clock):
    settings.FEED_RATE_PER_HOUR = 3
    own, nodes = feed_path(alice), feed_path(alice, node)
    for _ in range(3):
        assert fetch(own).status_code == 200

    refused = fetch(own)
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 3600
    assert fetch(nodes).status_code == 200  # another URL is counted apart

    clock.shift(3600)
    assert fetch(own).status_code == 200


def test_the_profile_shows_as_many_node_feeds_as_there_are_nodes(alice, node):
    type(node).objects.create(name="gpu-h100", hostname="h100.lab.example")
    assert [link.node for link in feed_links(user=alice)] == [None, "gpu-a100", "gpu-h100"]
    assert read_feed(alice).x_wr_calname.value == "My GPU bookings"
