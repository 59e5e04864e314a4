"""The feed endpoint: ``GET /feeds/<token>.ics``, for calendar apps (no login, the URL is the key); and the
profile page's "Calendar feeds" section (a part registered in FeedsConfig.ready()) with its rotate button.

Every refusal is the same bare 404, whether the token is malformed, forged, rotated, of a
deactivated user or of a node that is gone: the answer tells a guesser nothing. Each token may be
fetched FEED_RATE_PER_HOUR times an hour (counted before anything is read from the database), so a
leaked URL cannot be used to load the server; rotating gives a fresh URL and allowance.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.http.request import split_domain_port
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import get_conditional_response
from django.views.decorators.http import require_POST, require_safe

from accounts.http import AuthenticatedHttpRequest
from feeds.ical import FeedContext, build_calendar
from feeds.selectors import feed_bookings, feed_listing, feed_subject
from feeds.services import feed_urls_rotate
from feeds.tokens import parse_feed_token

RATE_WINDOW_SECONDS = 3600


def _not_found() -> HttpResponse:
    return HttpResponseNotFound("Not found.\n", content_type="text/plain; charset=utf-8")


def _over_rate(token: str) -> bool:
    """A fixed one-hour window per token in Django's cache; the key is a hash, never the token."""
    now = int(timezone.now().timestamp())
    window = now // RATE_WINDOW_SECONDS
    key = f"feeds:rate:{hashlib.sha256(token.encode()).hexdigest()[:32]}:{window}"
    cache.add(key, 0, timeout=RATE_WINDOW_SECONDS + 60)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=RATE_WINDOW_SECONDS + 60)
        count = 1
    return count > settings.FEED_RATE_PER_HOUR


@require_safe
def feed(request: HttpRequest, token: str) -> HttpResponse:
    parsed = parse_feed_token(token)
    if parsed is None:
        return _not_found()
    if _over_rate(token):
        retry = RATE_WINDOW_SECONDS - int(timezone.now().timestamp()) % RATE_WINDOW_SECONDS
        response = HttpResponse(
            "Too many requests for this feed.\n", status=429, content_type="text/plain; charset=utf-8"
        )
        response["Retry-After"] = str(retry)
        return response
    subject = feed_subject(parsed)
    if subject is None:
        return _not_found()
    user, node = subject
    now = timezone.now()
    bookings = feed_bookings(
        user=user,
        node=node,
        start=now - timedelta(days=settings.FEED_PAST_DAYS),
        end=now + timedelta(days=settings.FEED_FUTURE_DAYS),
    )
    context = FeedContext(
        subscriber=user,
        node=node.name if node else None,
        uid_host=split_domain_port(request.get_host())[0],
        mine_url=request.build_absolute_uri(reverse("my-reservations")),
        calendar_url=request.build_absolute_uri(reverse("calendar")),
    )
    body = build_calendar(bookings, context)
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    conditional = get_conditional_response(request, etag=etag)
    response = conditional or HttpResponse(body, content_type="text/calendar; charset=utf-8")
    response["ETag"] = etag
    # Only the subscriber's client may keep a copy, and it asks again (cheaply, with the ETag) each poll.
    response["Cache-Control"] = "private, no-cache"
    filename = "my-gpu-bookings.ics" if node is None else f"{node.name}.ics"
    response["Content-Disposition"] = f'inline; filename="{filename}"'
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = "no-referrer"
    return response


# --- the profile page's section ----------------------------------------------------------------


def profile_section(*, request: AuthenticatedHttpRequest) -> dict[str, Any]:
    """What templates/feeds/profile_section.html shows: the person's feed URLs, and when they last rotated them."""
    listing = feed_listing(request.user, request.build_absolute_uri)
    return {"feeds": listing.feeds, "rotated_at": listing.rotated_at}


@login_required
@require_POST
def feeds_rotate(request: AuthenticatedHttpRequest) -> HttpResponse:
    feed_urls_rotate(user=request.user, actor=request.user)
    messages.success(
        request,
        "New calendar feed URLs: the old ones now answer “not found”. "
        "Give the new URL to each calendar that subscribed to an old one.",
    )
    return redirect(f"{reverse('profile')}#feeds-h")
