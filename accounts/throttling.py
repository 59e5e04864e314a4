"""Throttles on guessing credentials (docs/security.md, "Login throttling").

Logins (password form, Django admin, LDAP through the same form, OpenID Connect callbacks) go through
django-axes, configured in settings (AXES_*) to call the functions here. Failures are counted in the
database by the username typed and by the client's address; LOGIN_FAILURE_LIMIT of either locks it
out until LOGIN_LOCKOUT_MINUTES after the last counted failure. axes' backend comes first in
AUTHENTICATION_BACKENDS, so a locked-out attempt is refused before any password is checked, locally
or by the LDAP directory. The person sees when they may try again (``login_lockout``).

API tokens (``Authorization: Bearer``) are throttled per client address: API_TOKEN_FAILURES_PER_MINUTE
failed tokens in a minute, and that address gets 429 with Retry-After until the minute is over,
whatever token it sends, so the answer never tells a guessed token apart. Counted in Redis, shared by
every web process; with Redis away the throttle lets requests through (and logs it) rather than
refusing every script.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username, get_cool_off
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.formats import date_format

from kernel.redis_client import redis_client

logger = logging.getLogger(__name__)


# --- who is asking ---------------------------------------------------------------------------


def client_address(request: HttpRequest) -> str | None:
    """The client's address: REMOTE_ADDR, or behind NUM_PROXIES reverse proxies the address the
    outermost of them appended to X-Forwarded-For (counted from the right, as DRF's throttles do).
    Anything that is not an IP address falls back to REMOTE_ADDR."""
    remote = request.META.get("REMOTE_ADDR") or None
    if settings.NUM_PROXIES > 0:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [part for part in forwarded if part]
        if forwarded:
            candidate = forwarded[-min(settings.NUM_PROXIES, len(forwarded))]
            try:
                return str(ipaddress.ip_address(candidate))
            except ValueError:
                pass
    return remote


def lockout_username(request: HttpRequest, credentials: dict[str, Any] | None) -> str | None:
    """The username failures are counted under: as typed, without surrounding blanks, in lower case, so
    'Dana' and 'DANA' (the same person to an LDAP directory) share one count."""
    source = credentials if credentials is not None else getattr(request, "POST", {})
    value = source.get("username") if source else None
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip().lower()


def lockout_parameters(request: Any, credentials: dict[str, Any] | None) -> list[str]:
    """Count per username and per address; an attempt that names no username (an OpenID Connect
    callback) per address only. (Counting it under "no username" would pool every such attempt on the
    site into one count, and lock them all out together.)"""
    username = get_client_username(request, credentials) if isinstance(request, HttpRequest) else request.username
    return ["username", "ip_address"] if username else ["ip_address"]


# --- locked out: until when, and the page that says so ----------------------------------------


@dataclass(frozen=True)
class LoginLockout:
    retry_at: datetime

    def seconds_left(self, now: datetime) -> int:
        return max(1, math.ceil((self.retry_at - now).total_seconds()))

    def message(self, now: datetime) -> str:
        minutes = max(1, round(self.seconds_left(now) / 60))
        local = timezone.localtime(self.retry_at)
        when = f"{date_format(local, 'H:i')} {local.tzname()}"
        return (
            f"Too many failed logins for this username or from your address. "
            f"Try again in {minutes} minute{'s' if minutes != 1 else ''}, at {when}, "
            f"or ask an administrator to unlock it."
        )


def login_lockout(request: HttpRequest) -> LoginLockout:
    """When the lockout that refused this request ends: LOGIN_LOCKOUT_MINUTES after the failure that
    brought the count of recent failures (for the username, or from the address) to the limit.

    axes keeps one row per username, address and browser, with its count and the time of its last
    failure; the newest rows whose counts reach the limit hold the lockout, and it ends when the
    oldest of those ages out."""
    credentials = getattr(request, "axes_credentials", None)
    cool_off = get_cool_off(request) or timedelta(minutes=settings.LOGIN_LOCKOUT_MINUTES)
    now = timezone.now()
    ends = []
    for attempts in AxesProxyHandler.get_implementation().get_user_attempts(request, credentials):
        counted = 0
        for failures, attempt_time in attempts.order_by("-attempt_time").values_list(
            "failures_since_start", "attempt_time"
        ):
            counted += failures
            if counted >= settings.AXES_FAILURE_LIMIT:
                # axes still counts an attempt exactly cool_off old: the lockout ends a second later.
                ends.append(attempt_time + cool_off + timedelta(seconds=1))
                break
    return LoginLockout(retry_at=max(ends, default=now + cool_off))


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """The answer to a locked-out login: 429 with Retry-After. The portal's login form has already put
    the message on its own page (accounts.sso.LoginForm); any other login (Django admin, an OpenID
    Connect callback) gets a page of its own that says the same. Also AXES_LOCKOUT_CALLABLE, for any
    axes code path that answers a lockout itself."""
    lockout = login_lockout(request)
    now = timezone.now()
    if getattr(request, "login_lockout_shown", False) and isinstance(original_response, HttpResponse):
        response = original_response
    else:
        response = render(request, "registration/locked_out.html", {"message": lockout.message(now)})
    response.status_code = 429
    response["Retry-After"] = str(lockout.seconds_left(now))
    return response


class LoginLockoutMiddleware:
    """Answers a login that axes refused or locked (``request.axes_locked_out``) with
    ``lockout_response``. In place of axes' own AxesMiddleware, whose async path (the one daphne takes)
    hands the lockout callable the credentials where the response belongs in axes 8.3.

    Synchronous only, like every middleware of the portal: under ASGI a chain of synchronous middleware
    runs in one worker thread, where one async-capable middleware at its foot made each request go back
    to the event loop and into a thread again twice (MessageMiddleware's hooks, then the view): about a
    tenth of an agent report's time on the web process (bench/live.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        response = self.get_response(request)
        return lockout_response(request, response) if _locked_out(request) else response


def _locked_out(request: HttpRequest) -> bool:
    # AXES_ENABLED is django-axes' setting, defaulted by axes.conf rather than in portal/settings.py.
    return bool(getattr(settings, "AXES_ENABLED", True) and getattr(request, "axes_locked_out", False))


# --- API tokens --------------------------------------------------------------------------------

_TOKEN_WINDOW_SECONDS = 60
_FAILED_TOKENS_KEY = "accounts:failed-tokens:{address}:{window}"
FAILED_TOKENS_PATTERN = "accounts:failed-tokens:*"  # every count, for a SCAN


def _token_window(now: datetime) -> tuple[int, int]:
    """The current one-minute window and the seconds left in it."""
    seconds = int(now.timestamp())
    return seconds // _TOKEN_WINDOW_SECONDS, _TOKEN_WINDOW_SECONDS - seconds % _TOKEN_WINDOW_SECONDS


def token_throttle_wait(address: str | None) -> int | None:
    """Seconds until ``address`` may send tokens again, or None when it may now."""
    if address is None:
        return None
    window, left = _token_window(timezone.now())
    try:
        failures = redis_client().get(_FAILED_TOKENS_KEY.format(address=address, window=window))
    except redis.RedisError as error:
        logger.warning("API token throttle not checked (Redis: %s)", error)
        return None
    return left if failures is not None and int(failures) >= settings.API_TOKEN_FAILURES_PER_MINUTE else None


def token_failure_record(address: str | None) -> None:
    """Count one failed token from ``address`` in the current minute."""
    if address is None:
        return
    window, _ = _token_window(timezone.now())
    key = _FAILED_TOKENS_KEY.format(address=address, window=window)
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, 2 * _TOKEN_WINDOW_SECONDS)
        pipe.execute()
    except redis.RedisError as error:
        logger.warning("API token failure not counted (Redis: %s)", error)
