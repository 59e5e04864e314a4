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
# segment. A segment with two dots (or encoded ones) may be a token, whether or not it is valid now; one dot
# is a file's name (a traceback's /work/.../feeds/ical.py), which no token is: user, feed and MAC need two.
_FEED_PATH = re.compile(r"/feeds/([^/\s\"'?#<>]+)")
_TOKEN_PARTS = re.compile(r"\A[1-9][0-9]{0,17}\.(?:mine|n[1-9][0-9]{0,17})\.")


def _redact_feed_path(match: re.Match[str]) -> str:
    segment = match[1]
    if segment.count(".") + segment.lower().count("%2e") < 2:
        return match[0]  # e.g. /api/v1/feeds/rotate/, feeds/ical.py: no token here
    kept = _TOKEN_PARTS.match(segment)
    return f"/feeds/{kept[0] if kept else ''}[redacted]{'.ics' if segment.endswith('.ics') else ''}"


# A token wherever it stands (another path, a query parameter, a spelling the view refuses such as ``0017`` or
# ``MINE``): its MAC is the secret whichever URL carries it. Eight characters on, so a truncated MAC goes too.
_TOKEN_ANYWHERE = re.compile(r"([0-9]{1,20}\.(?:[Mm][Ii][Nn][Ee]|[Nn][0-9]{1,20})\.)[A-Za-z0-9_-]{8,}")
# And a MAC standing alone, whatever surrounds it: a run of 43 or more base64url characters with a digit, an
# upper- and a lower-case letter, as all but one MAC in a thousand has (a long snake_case name or a hex digest
# has not, and stays).
_MAC_LIKE = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43,}(?![A-Za-z0-9_-])")


def _redact_mac_like(match: re.Match[str]) -> str:
    run = match[0]
    if any(c.isdigit() for c in run) and any(c.isupper() for c in run) and any(c.islower() for c in run):
        return "[redacted]"
    return run


def redact_feed_urls(text: str) -> str:
    """``text`` with the secret of every feed URL replaced: ``/feeds/17.mine.[redacted].ics``. The user
    id and feed name stay (they are not secret, and say whose feed was asked for). kernel.logs also
    hands this every percent-encoded word decoded, so ``/%66eeds/…`` and ``/feeds%2F…`` go the same way."""
    if "/feeds/" in text:
        text = _FEED_PATH.sub(_redact_feed_path, text)
    text = _TOKEN_ANYWHERE.sub(r"\1[redacted]", text)
    return _MAC_LIKE.sub(_redact_mac_like, text)


def feed_token_valid(token: FeedToken, *, generation: int) -> bool:
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return any(
        constant_time_compare(token.mac, _mac(token.user_id, token.feed, generation, secret)) for secret in secrets
    )
