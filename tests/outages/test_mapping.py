"""Which faults answer 503 with words and Retry-After (kernel/outages.py), and which stay the 500 of a bug, logged
with its trace. The errors are the drivers' own classes, wrapped as Django wraps them; tests/outages/
test_database_restart.py and test_redis_restart.py meet the real ones."""

from __future__ import annotations

import logging
import sqlite3

import django.db
import psycopg
import psycopg.errors
import pytest
import redis
from django.db import connection
from django.test import Client, RequestFactory
from psycopg_pool import PoolTimeout
from redis._parsers import BaseParser

from kernel.outages import server_error
from tests.nodes.broker_redis import AclRedis
from tests.outages import urls

pytestmark = pytest.mark.urls("tests.outages.urls")


def wrapped(driver_error: Exception) -> Exception:
    """``driver_error`` as Django's database layer raises it: its own class, the driver's as the cause."""
    django_class = django.db.OperationalError
    try:
        try:
            raise driver_error
        except Exception as cause:
            raise django_class(str(cause)) from cause
    except django_class as error:
        return error


REFUSED = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused'
OUTAGES = {
    "restart": (wrapped(psycopg.errors.AdminShutdown("terminating connection due to administrator command")),
                "database_restarting", "5", "The database is restarting; try again in a few seconds."),
    "starting": (wrapped(psycopg.OperationalError("connection failed: FATAL:  the database system is starting up")),
                 "database_restarting", "5", "The database is restarting"),
    "refused": (wrapped(psycopg.OperationalError(REFUSED)), "database_unavailable", "10",
                "The database is not answering"),
    "pool": (wrapped(PoolTimeout("couldn't get a connection after 10.00 sec")), "database_unavailable", "10",
             "The database is not answering"),
    "lock": (wrapped(psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")), "database_busy", "2",
             "locked by other work"),
    "serialization": (wrapped(psycopg.errors.SerializationFailure("could not serialize access")),
                      "database_busy", "2", "locked by other work"),
    "sqlite-lock": (wrapped(sqlite3.OperationalError("database is locked")), "database_busy", "2", "locked"),
    "full": (wrapped(psycopg.errors.TooManyConnections("sorry, too many clients already")), "database_overloaded",
             "10", "no connection or resources to spare"),
    "redis": (redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
              "redis_unavailable", "5", "(Redis) is not answering"),
    "redis-timeout": (redis.TimeoutError("Timeout reading from socket"), "redis_unavailable", "5", "(Redis)"),
    # As redis-py raises Redis' "OOM" reply: an OutOfMemoryError, the "OOM" cut off its message.
    "redis-oom": (BaseParser.parse_error("OOM command not allowed when used memory > 'maxmemory'."), "redis_full",
                  "30", "out of memory"),
}  # fmt: skip
# Retryable for the client, but our own code may be their cause: logged with the trace.
OURS_MAYBE = {
    "deadlock": wrapped(psycopg.errors.DeadlockDetected("deadlock detected")),
    "statement-timeout": wrapped(psycopg.errors.QueryCanceled("canceling statement due to statement timeout")),
}


@pytest.fixture(autouse=True)
def no_fault():
    urls.fault["error"] = None
    urls.calls.clear()
    urls.failing_renders.clear()
    yield
    urls.fault["error"] = None
    urls.failing_renders.clear()


@pytest.mark.parametrize("name", OUTAGES)
def test_an_outage_met_by_the_api_is_a_503_with_its_cause_words_and_retry_after(name, client, caplog):
    error, code, retry_after, words = OUTAGES[name]
    urls.fault["error"] = error
    with caplog.at_level(logging.INFO):
        response = client.get(f"/api/v1/test-fault/{name}/")
    assert response.status_code == 503
    assert response["Retry-After"] == retry_after
    assert response["Cache-Control"] == "no-store"
    body = response.json()["error"]
    assert body["code"] == code
    assert words in body["message"]
    assert body["details"] == {}
    # One warning that names the cause, no trace and no "Internal Server Error".
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    warning = next(r for r in caplog.records if r.name == "kernel.outages")
    assert warning.levelno == logging.WARNING and warning.exc_info is None
    assert f"503 {code}: GET /api/v1/test-fault/{name}/" in warning.getMessage()


@pytest.mark.parametrize("name", OURS_MAYBE)
@pytest.mark.parametrize("path", ["/api/v1/test-fault/{}/", "/test-fault/{}/"])
def test_a_deadlock_or_statement_timeout_is_a_503_logged_with_its_trace(name, path, client, caplog):
    """The client may retry; the log shows where our code met it, since the cause may be a bug of ours."""
    urls.fault["error"] = OURS_MAYBE[name]
    response = client.get(path.format(name))
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert "locked by other work" in response.content.decode()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []  # no "Internal Server Error"
    warning = next(r for r in caplog.records if r.name == "kernel.outages")
    assert warning.levelno == logging.WARNING and warning.getMessage().startswith("503 database_busy: GET ")
    assert warning.exc_info is not None and warning.exc_info[1] is OURS_MAYBE[name]
    assert warning.exc_info[2] is not None  # the trace, down to the view that met it
    assert urls.calls[name] == 1  # not retried: a fresh connection cures neither


def test_a_real_redis_out_of_memory_is_a_503_redis_full(client):
    """What redis-py raises when a redis-server with maxmemory and noeviction is full."""
    full = AclRedis("--maxmemory", "2mb", "--maxmemory-policy", "noeviction", database=0)
    try:
        admin = full.admin()
        with pytest.raises(redis.RedisError) as refused:
            for number in range(1000):  # 64 KiB apiece: 2 MiB are full after a few dozen
                admin.set(f"filler:{number}", b"x" * 65536)
        admin.close()
    finally:
        full.stop()
    urls.fault["error"] = refused.value
    response = client.get("/api/v1/test-fault/full-redis/")
    assert response.status_code == 503, refused.value
    assert response["Retry-After"] == "30"
    assert response.json()["error"]["code"] == "redis_full"


@pytest.mark.parametrize("name", ["restart", "refused", "lock", "redis"])
def test_a_page_that_meets_an_outage_shows_the_maintenance_page_without_the_database(
    name, db, client, django_assert_num_queries
):
    error, _, retry_after, words = OUTAGES[name]
    urls.fault["error"] = error
    with django_assert_num_queries(0):  # the page itself reads nothing: not the session, not the user
        response = client.get(f"/test-fault/{name}/")
    assert response.status_code == 503
    assert response["Retry-After"] == retry_after
    page = response.content.decode()
    assert "<h1>Back in a moment</h1>" in page
    assert words in page
    assert 'href="/test-fault/' in page  # "Try again": the same page
    assert "<script" not in page


def test_a_read_is_tried_again_once_when_its_connection_broke_and_a_write_never(client):
    urls.fault["error"] = OUTAGES["restart"][0]
    assert client.get("/api/v1/test-fault/read/").status_code == 503
    assert urls.calls["read"] == 2  # once more, on a fresh connection; then the 503
    assert client.post("/api/v1/test-fault/write/").status_code == 503
    assert urls.calls["write"] == 1  # a write may have committed before its connection broke
    urls.fault["error"] = OUTAGES["lock"][0]
    assert client.get("/api/v1/test-fault/locked/").status_code == 503
    assert urls.calls["locked"] == 1  # a new connection does not free a lock
    urls.fault["error"] = OUTAGES["pool"][0]
    assert client.get("/api/v1/test-fault/pooled/").status_code == 503
    assert urls.calls["pooled"] == 1  # the pool waited for a fresh connection already


@pytest.mark.parametrize("path", ["//evil.example/", "/\\evil.example/", "//evil.example/test-fault/x/"])
def test_the_maintenance_pages_try_again_link_never_leads_to_another_site(path, client):
    """``GET //evil.example/`` during an outage: its path is a protocol-relative URL, so the link goes to "/"."""
    urls.fault["error"] = OUTAGES["refused"][0]
    response = client.get("/", PATH_INFO=path)
    assert response.status_code == 503
    page = response.content.decode()
    assert "<h1>Back in a moment</h1>" in page
    assert '<a href="/">Try again</a>' in page
    assert "evil.example" not in page


def test_a_read_whose_lazy_response_failed_while_rendering_is_tried_again_and_rendered(client):
    """Django calls process_exception when a TemplateResponse fails to render too, and renders nothing it returns."""
    urls.failing_renders.append(OUTAGES["refused"][0])
    response = client.get("/test-rendered-later/once/")
    assert response.status_code == 200
    assert response.content.decode() == "<p>rendered</p>"
    assert urls.calls["once"] == 2

    urls.failing_renders.extend(
        [wrapped(psycopg.OperationalError(REFUSED)), wrapped(psycopg.OperationalError(REFUSED))]
    )
    response = client.get("/test-rendered-later/twice/")
    assert response.status_code == 503
    assert response["Retry-After"] == "10"
    assert "The database is not answering" in response.content.decode()
    assert urls.calls["twice"] == 2
    assert urls.failing_renders == []

    urls.failing_renders.append(wrapped(psycopg.OperationalError(REFUSED)))
    response = client.post("/test-rendered-later/write/")
    assert response.status_code == 503
    assert urls.calls["write"] == 1  # a write is never tried again


@pytest.mark.postgres_only
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL ends the session")
def test_a_read_whose_session_postgresql_ended_is_answered_on_a_fresh_connection(transactional_db, client, caplog):
    with caplog.at_level(logging.INFO):
        response = client.get("/api/v1/test-broken-connection/")
    assert response.status_code == 200, response.content
    assert response.json()["calls"] == 2
    assert any("retried on a fresh database connection" in r.getMessage() for r in caplog.records)

    urls.calls.clear()
    response = Client().post("/api/v1/test-broken-connection/")
    assert response.status_code == 503
    assert response.json()["error"]["code"] in ("database_restarting", "database_unavailable")
    assert urls.calls["breaks"] == 1
    # A server closes a failed connection when the request ends; Django's test client leaves that to the test.
    connection.close()


BUGS = {
    "zero": ZeroDivisionError("division by zero"),
    "no-table": wrapped(sqlite3.OperationalError("no such table: reservations_reservation")),
    "syntax": wrapped(psycopg.errors.SyntaxError('syntax error at or near "SELEC"')),
    "redis-wrong-type": redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
}


@pytest.mark.parametrize("name", BUGS)
@pytest.mark.parametrize("path", ["/api/v1/test-fault/{}/", "/test-fault/{}/"])
def test_a_fault_in_our_code_stays_a_500_and_is_logged_with_its_trace(name, path, caplog):
    urls.fault["error"] = BUGS[name]
    response = Client(raise_request_exception=False).get(path.format(name))
    assert response.status_code == 500
    assert "Retry-After" not in response
    if path.startswith("/api/"):
        assert response.json()["error"]["code"] == "server_error"
    logged = next(r for r in caplog.records if r.name == "django.request")
    assert logged.levelno == logging.ERROR
    assert logged.exc_info is not None and logged.exc_info[1] is BUGS[name]
    assert urls.calls[name] == 1  # a bug is not retried


@pytest.mark.parametrize("path", ["/api/v1/gpus/", "/"])
def test_an_outage_met_outside_a_view_is_a_503_too(path, caplog):
    """handler500: a middleware reading the session's user, a template rendering, met the outage."""
    request = RequestFactory().get(path)
    try:
        raise OUTAGES["refused"][0]
    except django.db.OperationalError:
        response = server_error(request)
    assert response.status_code == 503
    assert response["Retry-After"] == "10"
    assert getattr(response, "_has_been_logged", False)  # Django's own "Internal Server Error" line is not written
    assert "The database is not answering" in response.content.decode()
    assert [r.name for r in caplog.records if r.levelno >= logging.WARNING] == ["kernel.outages"]

    try:
        raise BUGS["zero"]
    except ZeroDivisionError:
        assert server_error(request).status_code == 500
