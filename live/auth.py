"""Who is on the other end of a websocket, and may they connect from where they are.

Two ways in, the same as the REST API:
- a browser page: the session cookie (Channels' auth stack puts the user in the scope);
- a script: ``Authorization: Bearer gpb_...``, checked by ``accounts.authentication.user_for_token``.

The Origin rule is Django's CSRF rule for websockets. A browser sends cookies with a websocket
handshake from any site, so a cookie-authenticated connection must come from the portal's own
origin (the ``Host`` it asked for, itself one of ALLOWED_HOSTS) or one of CSRF_TRUSTED_ORIGINS.
A script sends no Origin and no cookie: a token connection without an Origin is accepted,
since no other site can make a browser send our token. A foreign Origin is refused whatever the
credentials, before the handshake completes (HTTP 403).

The scope says what was found: ``scope["user"]``, ``scope["api_token"]`` (or None), and
``scope["auth_error"]`` (a sentence for the client) when credentials were sent but are no good.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import split_domain_port, validate_host
from rest_framework import exceptions

from accounts.authentication import user_for_token


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin1")
    return None


def origin_allowed(origin: str, host: str | None) -> bool:
    """``origin`` is the portal's own (same host and port as ``host``) or a trusted one."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    if f"{parts.scheme}://{parts.netloc}".lower() in {o.lower() for o in settings.CSRF_TRUSTED_ORIGINS}:
        return True
    if not host:
        return False
    domain, _ = split_domain_port(host)
    return bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS) and parts.netloc.lower() == host.lower()


def bearer_key(scope: dict[str, Any]) -> str | None:
    """The token of an ``Authorization: Bearer`` header; '' when the header is malformed."""
    header = _header(scope, b"authorization")
    if header is None:
        return None
    words = header.split()
    if len(words) != 2 or words[0].lower() not in ("bearer", "token"):
        return ""
    return words[1]


@database_sync_to_async
def _token_user(key: str) -> tuple[Any, Any, str | None]:
    try:
        user, token = user_for_token(key)
    except exceptions.AuthenticationFailed as error:
        return AnonymousUser(), None, str(error.detail)
    return user, token, None


class LiveAuthMiddleware:
    """Wraps the websocket routes: Origin check, then the token, else the session."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.session_stack = AuthMiddlewareStack(inner)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        origin = _header(scope, b"origin")
        if origin is not None and not origin_allowed(origin, _header(scope, b"host")):
            return await WebsocketDenier()(scope, receive, send)
        key = bearer_key(scope)
        if key is None:
            if origin is None:
                # Cookies without an Origin: not a browser page of ours. Scripts use a token.
                scope = {**scope, "user": AnonymousUser(), "api_token": None}
                scope["auth_error"] = "Connect from the portal's pages, or send 'Authorization: Bearer <token>'."
                return await self.inner(scope, receive, send)
            return await self.session_stack({**scope, "api_token": None, "auth_error": None}, receive, send)
        if not key:
            user, token, error = AnonymousUser(), None, "Send the header as 'Authorization: Bearer <token>'."
        else:
            user, token, error = await _token_user(key)
        return await self.inner({**scope, "user": user, "api_token": token, "auth_error": error}, receive, send)
