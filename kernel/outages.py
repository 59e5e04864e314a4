"""Faults of what the portal stands on, answered as what they are: 503 with words and Retry-After.

The database restarting or unreachable, Redis away where a request needs it, a lock held past its timeout:
none of these is a fault in our code, and a client that gets the 500 of one cannot tell a planned restart
from a bug. Here such an exception becomes an ``Outage``, a code and a sentence for the person and a
Retry-After for the program::

    HTTP/1.1 503 Service Unavailable
    Retry-After: 5

    {"error": {"code": "database_restarting",
               "message": "The database is restarting; try again in a few seconds.", "details": {}}}

Pages get the maintenance page (templates/503.html), rendered without the database, Redis or the session. An
exception that is no outage is left alone: Django logs it with its trace and answers 500 (kernel/api.py).

Two hooks, one mapping:
- ``OutageMiddleware.process_exception``: an exception a view raised (the API's and the pages'). A safe request
  (GET, HEAD, OPTIONS) whose connection broke is first retried once on a fresh one; nothing else is retried,
  since a POST may have committed before its connection broke.
- ``server_error`` (handler500): an exception raised outside a view, in a middleware (the session's user is
  read there) or while a template renders. Django calls it only with DEBUG off; with DEBUG on such a fault
  shows Django's debug page, which is what a developer wants.

Connections that broke while idle are replaced before a request uses them, by the libraries themselves:
CONN_HEALTH_CHECKS in portal/settings.py, which is psycopg_pool's ``check`` for the pool (DB_POOL_MAX_SIZE; under
ASGI Django does not reuse a connection from one request to the next otherwise, DB_CONN_MAX_AGE or not: each
request's context opens its own). After PostgreSQL restarted while the portal was idle, the first request on each
of a pool's 4 connections failed without it, reads and writes alike (the retry here saved 3 of 4 reads and no
write); with it none did, for an empty query per request (about 56 µs here). The retry still serves a read whose
connection broke while it ran: with a pool it waits for the pool's next connection, so reads in flight during a
fast restart are answered (6 restarts under traffic: 2 and 5 reads failed without it, none with it).
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import redis
from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import get_template
from django.utils.http import url_has_allowed_host_and_scheme
from psycopg_pool import PoolTimeout

from kernel.api import error_body
from kernel.api import server_error as fault_in_our_code

logger = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Outage:
    code: str
    message: str
    retry_after: int  # seconds
    what: str  # which dependency, in words: the log line, and what a live page says it waits for (live/outages.py)
    fresh_connection_may_cure: bool = False  # a safe request is retried once on a new database connection
    # A fault our own code may have caused (a deadlock, a statement timeout): the client still gets the retryable
    # 503, and the log gets the trace, so that a bug behind it does not hide among outage warnings.
    logged_with_trace: bool = False


DATABASE_RESTARTING = Outage(
    "database_restarting", "The database is restarting; try again in a few seconds.", 5, "the database", True
)
DATABASE_UNAVAILABLE = Outage(
    "database_unavailable",
    "The database is not answering (it may be restarting); try again in a few seconds.",
    10,
    "the database",
    True,
)
# The pool waited DB_POOL_TIMEOUT for a connection already: another wait would only double the client's.
DATABASE_NO_CONNECTION = Outage(
    "database_unavailable",
    "The database is not answering (it may be restarting); try again in a few seconds.",
    10,
    "the database",
)
DATABASE_OVERLOADED = Outage(
    "database_overloaded",
    "The database has no connection or resources to spare right now; try again in a few seconds.",
    10,
    "the database",
)
DATABASE_BUSY = Outage(
    "database_busy",
    "The data this needs is locked by other work right now; try again in a moment.",
    2,
    "a database lock",
)
# The same answer; our queries' order (a deadlock) or length (statement_timeout) may be the cause.
DATABASE_BUSY_BY_US = Outage(
    "database_busy",
    "The data this needs is locked by other work right now; try again in a moment.",
    2,
    "a database lock",
    logged_with_trace=True,
)
REDIS_UNAVAILABLE = Outage(
    "redis_unavailable",
    "A service the portal needs for this (Redis) is not answering; try again in a few seconds.",
    5,
    "Redis",
)
REDIS_FULL = Outage(
    "redis_full",
    "A service the portal needs for this (Redis) is out of memory; try again later.",
    30,
    "Redis",
)

# SQLSTATE classes and codes (https://www.postgresql.org/docs/current/errcodes-appendix.html).
_RESTARTING = {"57P01", "57P02", "57P03"}  # admin_shutdown, crash_shutdown, cannot_connect_now
_BUSY = {"55P03", "40001"}  # lock_not_available (lock_timeout), serialization_failure
_BUSY_BY_US = {"40P01", "57014"}  # deadlock_detected, query_canceled (statement_timeout)
# What libpq says when the server is on its way down or up (no SQLSTATE: the connection itself failed).
_RESTARTING_WORDS = ("shutting down", "starting up", "in recovery mode", "terminating connection")


def outage_of(error: BaseException | None) -> Outage | None:
    """The outage behind ``error`` (Django's database errors wrap the driver's: the whole chain is read), or
    None when it is a fault of ours."""
    for cause in _chain(error):
        if isinstance(cause, PoolTimeout):
            # No connection within DB_POOL_TIMEOUT: the database does not take new ones, or every one is busy.
            return DATABASE_NO_CONNECTION
        if isinstance(cause, psycopg.Error):
            return _postgres(cause)
        if isinstance(cause, sqlite3.OperationalError):
            return _sqlite(cause)
        if isinstance(cause, redis.ConnectionError | redis.TimeoutError):
            return REDIS_UNAVAILABLE
        # redis-py turns Redis' "OOM ..." reply into OutOfMemoryError, the "OOM" cut off its message.
        if isinstance(cause, redis.exceptions.OutOfMemoryError) or (
            isinstance(cause, redis.ResponseError) and str(cause).startswith("OOM")
        ):
            return REDIS_FULL
    return None


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _postgres(error: psycopg.Error) -> Outage | None:
    state = error.sqlstate
    if state is None:
        # The connection itself failed or broke: refused, closed, reset. Nothing a query of ours caused.
        if not isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            return None
        words = str(error).lower()
        return DATABASE_RESTARTING if any(w in words for w in _RESTARTING_WORDS) else DATABASE_UNAVAILABLE
    if state in _RESTARTING:
        return DATABASE_RESTARTING
    if state in _BUSY:
        return DATABASE_BUSY
    if state in _BUSY_BY_US:
        return DATABASE_BUSY_BY_US
    if state.startswith("08"):  # connection_exception
        return DATABASE_UNAVAILABLE
    if state.startswith("53"):  # insufficient_resources: too many connections, out of memory or disk
        return DATABASE_OVERLOADED
    return None


def _sqlite(error: sqlite3.OperationalError) -> Outage | None:
    words = str(error).lower()
    if "database is locked" in words or "database table is locked" in words:
        return DATABASE_BUSY
    if "unable to open database file" in words or "disk i/o error" in words:
        return DATABASE_UNAVAILABLE
    return None  # "no such table", a syntax error...: ours


# --- answering -------------------------------------------------------------------------------------


def outage_response(request: HttpRequest, outage: Outage) -> HttpResponse:
    """The 503: the API's error body under /api/, the maintenance page elsewhere; Retry-After on both."""
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse(error_body(outage.code, outage.message), status=503)
    else:
        # A plain context: no context processor runs (the user, the messages: the session, the database).
        page = get_template("503.html").render({"message": outage.message, "path": same_page(request)})
        response = HttpResponse(page, status=503)
    response["Retry-After"] = str(outage.retry_after)
    response["Cache-Control"] = "no-store"  # a proxy must not keep serving it once the fault is over
    response._has_been_logged = True  # type: ignore[attr-defined]  # log_outage said it, without a trace
    return response


def same_page(request: HttpRequest) -> str:
    """The page's own path for the "Try again" link, or "/" where a browser would read it as another site's:
    ``GET //evil.example/`` has the path ``//evil.example/``, a protocol-relative URL (``/\\evil.example/`` too)."""
    path = request.path
    if path.startswith("/") and url_has_allowed_host_and_scheme(path, allowed_hosts=None):
        return path
    return "/"


def log_outage(request: HttpRequest, outage: Outage, error: BaseException) -> None:
    """One warning line per request that met the outage: the cause, not a trace (it is not our bug), unless our
    code may have caused it (``Outage.logged_with_trace``)."""
    logger.warning(
        "503 %s: %s %s (%s: %s)",
        outage.code,
        request.method,
        request.path,
        type(error).__name__,
        str(error).strip().splitlines()[0] if str(error).strip() else "",
        exc_info=error if outage.logged_with_trace else None,
        extra={"status_code": 503, "outage": outage.code, "dependency": outage.what},
    )


class OutageMiddleware:
    """An outage met by a view becomes the 503 (see the module's docstring), after one retry on a fresh
    connection for a safe request whose connection broke."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        outage = outage_of(exception)
        if outage is None:
            return None  # ours: Django logs it with its trace and answers 500
        if outage.fresh_connection_may_cure and _may_retry(request):
            request._outage_retried = True  # type: ignore[attr-defined]
            _drop_broken_connections()
            match = request.resolver_match
            assert match is not None  # a view raised, so the URL resolved
            try:
                response: HttpResponse = match.func(request, *match.args, **match.kwargs)
                # Django renders a lazy response (TemplateResponse: admin, LoginView, DRF) after the view, and calls
                # this hook when that render fails too; then it renders nothing returned here. Render it now, so
                # that a failure while rendering is met here as well.
                if callable(getattr(response, "render", None)) and not getattr(response, "is_rendered", True):
                    response = response.render()  # type: ignore[attr-defined]
            except Exception as again:
                outage = outage_of(again)
                if outage is None:
                    raise
                exception = again
            else:
                logger.info(
                    "%s %s: retried on a fresh database connection after %s",
                    request.method,
                    request.path,
                    type(exception).__name__,
                )
                return response
        log_outage(request, outage, exception)
        return outage_response(request, outage)


def _may_retry(request: HttpRequest) -> bool:
    """A safe request, not retried yet, outside any transaction (ATOMIC_REQUESTS is off)."""
    if request.method not in SAFE_METHODS or getattr(request, "_outage_retried", False):
        return False
    return not any(conn.in_atomic_block for conn in connections.all(initialized_only=True))


def _drop_broken_connections() -> None:
    """Close this thread's connections that failed, so the retry opens (or borrows) a fresh one; a pooled
    connection goes back to the pool, which discards it when it is broken."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            try:
                conn.close()
            except DatabaseError:
                conn.connection = None


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: an outage met outside a view (a middleware reading the session's user, a template rendering)
    is the 503 too; anything else is kernel/api.py's 500, already logged with its trace by Django."""
    error = sys.exc_info()[1]
    outage = outage_of(error)
    if outage is None or error is None:
        return fault_in_our_code(request)
    log_outage(request, outage, error)
    return outage_response(request, outage)
