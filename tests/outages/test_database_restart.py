"""PostgreSQL restarting under the production web server while four API clients book and read (issue 37).

The portal runs as the Procfile runs it (portal.serve, daphne) with a pool of 4 connections (DB_POOL_MAX_SIZE,
as docker-compose sets it) against a PostgreSQL cluster of the test's own, which is restarted twice during the
traffic: ``pg_ctl restart -m fast``, as an update does, and a stop of DOWN_SECONDS, longer than a request waits
for the pool (DB_POOL_TIMEOUT=3), so that requests are answered while the database is away. Nothing may be
answered 500; every 503 says why in words and when to retry; every booking answered 201 is in the database; and
the portal serves again within 5 s of the database answering. The figures are printed (pytest -s).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
from django.conf import settings
from django.db import connection

from tests.live.server import AsgiServer, open_client
from tests.outages.postgres import LocalPostgres
from tests.outages.traffic import Answer, Traffic, back_after, closing_words, prepare_database, summary

pytestmark = [
    pytest.mark.postgres_only,
    # One run of the suite is enough (the portal's own database is the test's cluster, whatever the suite's is).
    pytest.mark.skipif(connection.vendor != "postgresql", reason="run once, in the suite's PostgreSQL run"),
]

DOWN_SECONDS = 6.0
BACK_WITHIN_SECONDS = 5.0


def phase(traffic: Traffic, name: str, start: float, answering: float, until: float) -> dict[str, Any]:
    """What the clients saw from ``start`` (the database going away) until ``until`` (the next phase), and how soon
    they were served again after ``answering`` (the database answering a new connection)."""
    answers = [a for a in traffic.answers if start <= a.ended < until]
    first_booked = min((a.ended for a in answers if a.status == 201 and a.ended >= answering), default=None)
    return {
        "phase": name,
        "database away (s)": round(answering - start, 2),
        "503": sum(1 for a in answers if a.status == 503),
        "slowest answer (s)": round(max((a.ended - a.started for a in answers), default=0.0), 2),
        "last failure after it answered (s)": round(back_after(traffic, answering, until), 2),
        "first booking after it answered (s)": None if first_booked is None else round(first_booked - answering, 2),
    }


def test_postgresql_restarts_under_booking_traffic_answer_503_with_words_lose_nothing_and_recover():
    cluster = LocalPostgres()
    server: AsgiServer | None = None
    traffic: Traffic | None = None
    try:
        seed = prepare_database(DATABASE_URL=cluster.url, REDIS_URL=settings.REDIS_URL)
        server = AsgiServer(DATABASE_URL=cluster.url, DB_POOL_MAX_SIZE="4", DB_POOL_TIMEOUT="3", DEBUG="0")
        server.start()
        traffic = Traffic(server.url, seed)
        traffic.start()
        traffic.wait_for_successes(time.monotonic(), 12)

        # 1. pg_ctl restart -m fast: the sessions are ended, the server stops and starts again.
        restarting = time.monotonic()
        cluster.restart()
        restarted = cluster.wait_until_answering()
        traffic.wait_for_successes(restarted, 12)

        # 2. Away for DOWN_SECONDS. A page, and a live connection (the database is read at connect), meanwhile.
        stopping = time.monotonic()
        cluster.stop()
        page = requests.get(f"{server.url}/", cookies={settings.SESSION_COOKIE_NAME: seed["sessions"][0]}, timeout=60)
        live_messages, live_close, _ = closing_words(open_client(server, token=seed["tokens"][0]))
        time.sleep(max(0.0, stopping + DOWN_SECONDS - time.monotonic()))  # the outage's length, on purpose
        cluster.start()
        answering = cluster.wait_until_answering()
        traffic.wait_for_successes(answering, 12)
        traffic.stop()

        figures = [
            phase(traffic, "restart -m fast", restarting, restarted, until=stopping),
            phase(traffic, "stop", stopping, answering, until=float("inf")),
        ]
        print("\nPostgreSQL outages under 4 booking clients (portal.serve, DB_POOL_MAX_SIZE=4, DB_POOL_TIMEOUT=3):")
        for figure in figures:
            print("  ", figure)
        print("   answers:", summary(traffic))
        log = server.log_path.read_text(errors="replace")
        print("   reads retried on a fresh connection:", log.count("retried on a fresh database connection"))

        # No 500, and no request left without an answer.
        unanswered = [a for a in traffic.answers if a.status in (0, 500)]
        assert not unanswered, unanswered[:5]
        assert "Internal Server Error" not in log and "ERROR django.request" not in log
        # Every refusal is a 503 that says why and when to try again.
        refused = [a for a in traffic.answers if a.status not in (200, 201)]
        assert all(a.status == 503 for a in refused), refused[:5]
        assert all(_says_why(a) for a in refused), refused[:5]
        assert figures[1]["503"] > 0  # requests were answered while the database was away
        # Nothing confirmed is lost.
        booked = traffic.booked()
        assert len(booked) >= 8
        stored = {row[0] for row in cluster.query("SELECT id FROM reservations_reservation WHERE id = ANY(%s)", booked)}
        assert stored == set(booked)
        # Served again soon after the database answered.
        for figure in figures:
            assert figure["last failure after it answered (s)"] < BACK_WITHIN_SECONDS, figure
            assert figure["first booking after it answered (s)"] < BACK_WITHIN_SECONDS, figure
        # The page and the live connection met the outage too, and said so.
        assert page.status_code == 503
        assert page.headers["Retry-After"].isdigit()
        assert "<h1>Back in a moment</h1>" in page.text and "The database is not answering" in page.text
        assert live_close == 4503
        assert live_messages[-1]["type"] == "error"
        assert live_messages[-1]["message"] == "Live updates are paused while the portal waits for the database."
    finally:
        if traffic is not None:
            traffic.stop()
        if server is not None:
            server.stop()
        cluster.destroy()


def _says_why(answer: Answer) -> bool:
    return (
        answer.retry_after is not None
        and answer.retry_after.isdigit()
        and answer.code in ("database_restarting", "database_unavailable")
        and answer.message is not None
        and "try again in a few seconds" in answer.message
    )
