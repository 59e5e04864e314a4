from __future__ import annotations

from django.conf import settings
from django.db import models


class FeedKey(models.Model):
    """Which generation of feed URLs a user's are. Nothing here is secret.

    A feed URL carries an HMAC of (user id, feed, generation) keyed with a key derived from
    SECRET_KEY (feeds/tokens.py), so the portal can show a user's URLs again at any time without
    storing them. Rotating adds one to ``generation``: every URL of the previous generation stops
    matching at once. A user who never rotated has no row and generation 0.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="feed_key"
    )
    generation = models.PositiveIntegerField(default=0)
    rotated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"calendar feed URLs of {self.user_id} (generation {self.generation})"
