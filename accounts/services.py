"""Writes for accounts: API tokens."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken
from audit.services import audit_record

TOKEN_PREFIX = "gpb_"  # noqa: S105 - a public marker, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(
    *, user: Any, name: str, expires_at: datetime | None = None, actor: Any | None = None
) -> tuple[ApiToken, str]:
    """Create a token; returns the record and the token itself, which is never stored."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ValueError("Give the token a name of 1 to 100 characters.")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("The expiry must be in the future.")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        record = ApiToken.objects.create(
            user=user, name=name, prefix=token[:12], key_hash=hash_token(token), expires_at=expires_at
        )
        audit_record(actor=actor or user, action="api_token.create", target=record, after={"name": name})
    return record, token


def api_token_revoke(*, token: ApiToken, actor: Any) -> ApiToken:
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now())
        if updated:
            audit_record(actor=actor, action="api_token.revoke", target=token, before={"name": token.name})
    token.refresh_from_db()
    return token
