"""Writes for accounts: API tokens."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiToken, User
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


class UnixUsernameTaken(ValueError):
    """The unix username is someone else's, or was set meanwhile (it is set once)."""


def user_profile_update(*, user: User, changes: dict[str, Any], actor: Any) -> None:
    """Write the changed profile fields and audit them.

    The unix username is set once by its owner (it names the account that receives GPUs): the
    write is a compare-and-swap on "still empty", so two tabs or a race cannot overwrite it.
    """
    if not changes:
        return
    rows = User.objects.filter(pk=user.pk)
    before = rows.values(*changes).get()  # from the database: a bound form has already changed ``user``
    if "unix_username" in changes:
        rows = rows.filter(unix_username__isnull=True)
    try:
        with transaction.atomic():
            if rows.update(**changes) != 1:
                raise UnixUsernameTaken("Your unix username was set meanwhile; ask an admin to change it.")
            audit_record(actor=actor, action="user.profile", target=user, before=before, after=changes)
    except IntegrityError:
        raise UnixUsernameTaken(
            "Another portal account already has this unix username. If it is yours, ask an admin."
        ) from None
