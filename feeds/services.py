"""Writes for calendar feeds: rotating a user's feed URLs."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import User
from audit.services import audit_record
from feeds.models import FeedKey


def feed_urls_rotate(*, user: User, actor: Any) -> FeedKey:
    """Give ``user`` new feed URLs; every earlier one answers 404 from this commit on."""
    with transaction.atomic():
        key, _ = FeedKey.objects.get_or_create(user=user)
        before = key.generation
        FeedKey.objects.filter(pk=key.pk).update(generation=F("generation") + 1, rotated_at=timezone.now())
        key.refresh_from_db()
        audit_record(
            actor=actor,
            action="feed_urls.rotate",
            target=key,
            before={"generation": before},
            after={"generation": key.generation},
        )
    return key
