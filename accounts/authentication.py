"""DRF authentication with personal API tokens: ``Authorization: Bearer gpb_...``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.models import ApiToken
from accounts.services import hash_token
from accounts.throttling import client_address, token_failure_record, token_throttle_wait

# Writing last_used_at on every request would turn each read into a write; once a minute is enough.
_LAST_USED_RESOLUTION = timedelta(minutes=1)


def user_for_token(key: str) -> tuple[Any, ApiToken]:
    """The user a personal API token stands for; AuthenticationFailed says why not in words.
    The REST API and the websockets (live/auth.py) both authenticate through here."""
    token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(key)).first()
    now = timezone.now()
    state = None if token is None else token.state(now)
    if token is None or state == "revoked":
        raise exceptions.AuthenticationFailed("Unknown or revoked API token.")
    if state == "expired":
        raise exceptions.AuthenticationFailed("This API token has expired: create a new one.")
    if not token.user.is_active:
        raise exceptions.AuthenticationFailed("This account is disabled.")
    if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user, token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode(errors="replace") not in self.keywords:
            return None
        # Too many failed tokens from this address: refused before the token is even looked at, so a
        # guesser cannot tell a right token from a wrong one by the answer (accounts/throttling.py).
        address = client_address(request)
        wait = token_throttle_wait(address)
        if wait is not None:
            raise exceptions.Throttled(wait=wait, detail="Too many failed API tokens from your address.")
        try:
            return self._user_for_header(header)
        except exceptions.AuthenticationFailed:
            token_failure_record(address)
            raise

    def _user_for_header(self, header: list[bytes]) -> tuple[Any, ApiToken]:
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Send the header as 'Authorization: Bearer <token>'.")
        try:
            key = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token contains invalid characters.") from None
        return user_for_token(key)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'
