"""The secret part of feed URLs: ``<user id>.<feed>.<mac>``, e.g. ``17.n3.Zk3…`` (43 characters of MAC).

``<feed>`` is ``mine`` (the user's own bookings) or ``n<node id>`` (every booking on that node).
The MAC is HMAC-SHA256 over "user id:feed:generation" with a key derived from SECRET_KEY for this
purpose only (``salted_hmac`` with its own salt), so:

- nothing secret is stored: the database holds only the generation (feeds.models.FeedKey);
- the portal can show the URLs again whenever the user looks (a hashed random token could be
  shown only once, and calendar URLs are copied again for each new device);
- rotating (generation + 1) turns every earlier URL into a 404 at once;
- a URL names one user and one feed: changing the node id or user id in it breaks the MAC.

SECRET_KEY_FALLBACKS are accepted while verifying, as Django does for sessions and signatures, so a
SECRET_KEY rotation done Django's way keeps subscriptions working until the fallback is dropped.
"""

from __future__ import annotations

import re
from base64 import urlsafe_b64encode
from dataclasses import dataclass

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

MINE = "mine"
_KEY_SALT = "gpubook.feeds.url"
_TOKEN = re.compile(r"\A([1-9][0-9]{0,17})\.(mine|n[1-9][0-9]{0,17})\.([A-Za-z0-9_-]{43})\Z")


@dataclass(frozen=True)
class FeedToken:
    user_id: int
    feed: str  # "mine" or "n<node id>"
    mac: str

    @property
    def node_id(self) -> int | None:
        return None if self.feed == MINE else int(self.feed[1:])


def feed_name(node_id: int | None) -> str:
    return MINE if node_id is None else f"n{node_id}"


def _mac(user_id: int, feed: str, generation: int, secret: str) -> str:
    digest = salted_hmac(_KEY_SALT, f"{user_id}:{feed}:{generation}", secret=secret, algorithm="sha256").digest()
    return urlsafe_b64encode(digest).rstrip(b"=").decode()


def feed_token(*, user_id: int, node_id: int | None, generation: int) -> str:
    feed = feed_name(node_id)
    return f"{user_id}.{feed}.{_mac(user_id, feed, generation, settings.SECRET_KEY)}"


def parse_feed_token(token: str) -> FeedToken | None:
    """The token's parts if it has the right shape (the MAC is not checked here)."""
    match = _TOKEN.match(token)
    if match is None:
        return None
    return FeedToken(user_id=int(match[1]), feed=match[2], mac=match[3])


# A feed URL's path wherever it may be written down (a log line, a traceback): /feeds/ and one path
# segment. A segment with a dot (or an encoded one) may be a token, whether or not it is valid now.
_FEED_PATH = re.compile(r"/feeds/([^/\s\"'?#<>]+)")
_TOKEN_PARTS = re.compile(r"\A[1-9][0-9]{0,17}\.(?:mine|n[1-9][0-9]{0,17})\.")


def _redact_feed_path(match: re.Match[str]) -> str:
    segment = match[1]
    if "." not in segment and "%2e" not in segment.lower():
        return match[0]  # e.g. /api/v1/feeds/rotate/: no token here
    kept = _TOKEN_PARTS.match(segment)
    return f"/feeds/{kept[0] if kept else ''}[redacted]{'.ics' if segment.endswith('.ics') else ''}"


def redact_feed_urls(text: str) -> str:
    """``text`` with the secret of every feed URL replaced: ``/feeds/17.mine.[redacted].ics``. The user
    id and feed name stay (they are not secret, and say whose feed was asked for)."""
    if "/feeds/" not in text:
        return text
    return _FEED_PATH.sub(_redact_feed_path, text)


def feed_token_valid(token: FeedToken, *, generation: int) -> bool:
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return any(
        constant_time_compare(token.mac, _mac(token.user_id, token.feed, generation, secret)) for secret in secrets
    )
