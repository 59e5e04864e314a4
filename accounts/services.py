"""Writes for accounts: API tokens, the profile and the unix username."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any, TypedDict

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiToken, User
from accounts.signals import announce_deactivated, announce_unix_username
from accounts.validators import validate_unix_username
from audit.services import audit_record

TOKEN_PREFIX = "gpb_"  # noqa: S105 - a public marker, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(
    *, user: User, name: str, expires_at: datetime | None = None, actor: Any | None = None
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


PROFILE_FIELDS = frozenset({"timezone", "remind_before_end_minutes"})


def user_profile_update(*, user: User, changes: dict[str, Any], actor: Any) -> None:
    """Write the changed profile fields (time zone, reminder) and audit them. The unix username is
    not among them: it goes through the functions below, as UNIX_USERNAME_SOURCE says."""
    if not changes:
        return
    if not set(changes) <= PROFILE_FIELDS:
        raise ValueError(f"Not profile fields: {', '.join(sorted(set(changes) - PROFILE_FIELDS))}.")
    rows = User.objects.filter(pk=user.pk)
    before = rows.values(*changes).get()  # from the database: a bound form has already changed ``user``
    with transaction.atomic():
        rows.update(**changes)
        audit_record(actor=actor, action="user.profile", target=user, before=before, after=changes)


def user_deactivate(*, user: User, actor: Any | None, reason: str = "") -> bool:
    """Deactivate ``user``: no login, token, feed or websocket works for them any more, and once this
    commits reservations ends their bookings (accounts.signals.user_deactivated). True if this call
    did it (False: already inactive)."""
    with transaction.atomic():
        if not User.objects.filter(pk=user.pk, is_active=True).update(is_active=False):
            return False
        audit_record(actor=actor, action="user.deactivate", target=user, before={"is_active": True}, reason=reason)
        announce_deactivated(user.pk)
    user.is_active = False
    return True


# --- the unix username ------------------------------------------------------------------------
#
# It names the account on the GPU nodes that receives a person's booked GPUs, so where it comes
# from is a setting (UNIX_USERNAME_SOURCE, docs/security.md): the directory at each login, an admin,
# or a researcher's request that an admin confirms. Nothing is granted for a request until then.


class UnixUsernameError(ValueError):
    """A unix username cannot be requested, confirmed or set; the message says why and what to do."""


class UnixUsernameTaken(UnixUsernameError):
    """Another portal account has that unix username."""


def unix_username_source() -> str:
    return settings.UNIX_USERNAME_SOURCE


def who_sets_unix_usernames() -> str:
    """One sentence for people who may not set their own."""
    return {
        "directory": "It comes from the institutional directory when you log in; ask its administrators to change it.",
        "admin": "Only an admin of the portal sets it: ask one.",
        "request": "Request one in your profile; an admin confirms it.",
    }[unix_username_source()]


def _checked(name: object) -> str:
    if not isinstance(name, str):
        raise UnixUsernameError("The unix username must be text.")
    name = name.strip()
    try:
        validate_unix_username(name)
    except ValidationError as error:
        raise UnixUsernameError(" ".join(error.messages)) from None
    return name


def _holder(name: str, *, other_than: User) -> User | None:
    return User.objects.filter(unix_username=name).exclude(pk=other_than.pk).first()


def unix_username_request(*, user: User, name: str, actor: Any) -> str:
    """``user`` asks for ``name`` (an empty name withdraws the request); an admin confirms it.
    Returns the request now standing ("" for none)."""
    if unix_username_source() != "request":
        raise UnixUsernameError(f"You cannot choose your unix username here. {who_sets_unix_usernames()}")
    if actor.pk != user.pk and not actor.is_booking_admin:
        raise UnixUsernameError("Only the person themselves or an admin may request a unix username for them.")
    name = name.strip() if isinstance(name, str) else name
    if name != "":
        name = _checked(name)
        if name == user.unix_username:
            name = ""  # asking for what one has: nothing to confirm
        elif _holder(name, other_than=user) is not None:
            # Not who: a researcher must not learn which account another person uses.
            raise UnixUsernameTaken(
                f"{name!r} is already the unix username of another portal account. If it is yours, ask an admin."
            )
    with transaction.atomic():
        before = User.objects.filter(pk=user.pk).values_list("unix_username_requested", flat=True).get()
        if before == name:
            return name
        User.objects.filter(pk=user.pk).update(unix_username_requested=name)
        audit_record(
            actor=actor,
            action="user.unix_username.request" if name else "user.unix_username.withdraw",
            target=user,
            before={"unix_username_requested": before},
            after={"unix_username_requested": name},
        )
    user.unix_username_requested = name
    return name


def unix_username_confirm(*, user: User, name: str, actor: Any) -> None:
    """An admin confirms the unix username ``user`` requested (``name``, as the admin saw it: a
    request changed meanwhile is not confirmed blindly)."""
    _require_username_admin(actor)
    name = _checked(name)
    with transaction.atomic():
        before = User.objects.select_for_update().filter(pk=user.pk).values("unix_username", "unix_username_requested")
        current = before.get()
        if current["unix_username_requested"] != name:
            raise UnixUsernameError(
                f"{user.get_username()} no longer asks for {name!r} (now: "
                f"{current['unix_username_requested'] or 'nothing'}): look at the request again."
            )
        _write_unix_username(user, name, actor=actor, action="user.unix_username.confirm", before=current)


def unix_username_refuse(*, user: User, actor: Any, reason: str = "", name: str | None = None) -> None:
    """An admin turns a request down (``name``: the one the admin saw, when there is one); the
    researcher sees it gone and may ask for another."""
    _require_username_admin(actor)
    with transaction.atomic():
        requested = (
            User.objects.select_for_update().filter(pk=user.pk).values_list("unix_username_requested", flat=True).get()
        )
        if not requested:
            return
        if name is not None and requested != name:
            raise UnixUsernameError(
                f"{user.get_username()} no longer asks for {name!r} (now: {requested}): look at the request again."
            )
        User.objects.filter(pk=user.pk).update(unix_username_requested="")
        audit_record(
            actor=actor,
            action="user.unix_username.refuse",
            target=user,
            before={"unix_username_requested": requested},
            reason=reason.strip(),
        )
    user.unix_username_requested = ""


def _require_username_admin(actor: Any) -> None:
    if not getattr(actor, "is_booking_admin", False):
        raise UnixUsernameError("Only admins confirm or set unix usernames.")
    if unix_username_source() == "directory":
        raise UnixUsernameError(
            "Unix usernames come from the directory here (UNIX_USERNAME_SOURCE=directory): change it there."
        )


class _UnixUsernameRow(TypedDict):
    """The user's unix username columns before a change: for the audit entry and the announcement."""

    unix_username: str | None
    unix_username_requested: str


def _write_unix_username(user: User, name: str | None, *, actor: Any, action: str, before: _UnixUsernameRow) -> None:
    """Inside a transaction: the new unix username, the request cleared when it is granted."""
    holder = _holder(name, other_than=user) if name else None
    if holder is not None:
        raise UnixUsernameTaken(f"{name!r} is already the unix username of {holder.get_username()}.")
    requested = "" if before["unix_username_requested"] == name else before["unix_username_requested"]
    try:
        with transaction.atomic():
            User.objects.filter(pk=user.pk).update(unix_username=name, unix_username_requested=requested)
    except IntegrityError:
        raise UnixUsernameTaken(f"{name!r} became another account's unix username meanwhile.") from None
    audit_record(actor=actor, action=action, target=user, before=before, after={"unix_username": name})
    if before["unix_username"] != name:
        announce_unix_username(user.pk, before["unix_username"], name)
    user.unix_username, user.unix_username_requested = name, requested
