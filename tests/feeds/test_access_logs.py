"""A feed URL is its own key, so no log line may hold one: Django's request logger, daphne's access
log (portal/serve.py), JSON lines, Celery and tracebacks all go through the console handler's
RedactSecrets filter (kernel/logs.py). Each test reads what the real, configured handler wrote."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
import timeit
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote

import pytest
import requests
from django.conf import settings

from kernel.logs import redact_secrets
from portal.celery import app
from tests.agent.harness import free_port, port_open, wait_for
from tests.factories import UserFactory
from tests.test_settings import ROOT

from .conftest import feed_path, fetch

FORGED_MAC = "Zk3" + "q" * 40  # the right shape, the wrong key


@contextmanager
def console() -> Iterator[io.StringIO]:
    """What the portal's console handler (settings.LOGGING) writes while inside the block."""
    handler = next(h for h in logging.getLogger().handlers if h.name == "console")
    written = io.StringIO()
    previous = handler.setStream(written)
    try:
        yield written
    finally:
        handler.setStream(previous)


def secret_of(path: str) -> str:
    return path.removeprefix("/feeds/").removesuffix(".ics").split(".")[2]


def test_a_404_on_a_forged_feed_url_is_logged_without_its_secret(alice, db):
    path = f"/feeds/{alice.pk}.mine.{FORGED_MAC}.ics"
    with console() as lines:
        assert fetch(path).status_code == 404

    written = lines.getvalue()
    assert f"Not Found: /feeds/{alice.pk}.mine.[redacted].ics" in written
    assert FORGED_MAC not in written


def test_a_real_feed_url_refused_for_its_rate_is_logged_without_its_secret(alice, settings):
    settings.FEED_RATE_PER_HOUR = 1
    path = feed_path(alice)
    with console() as lines:
        assert fetch(path).status_code == 200
        assert fetch(path).status_code == 429

    written = lines.getvalue()
    assert f"Too Many Requests: /feeds/{alice.pk}.mine.[redacted].ics" in written
    assert secret_of(path) not in written


def test_arguments_extra_values_and_tracebacks_are_redacted_too(alice):
    path = feed_path(alice)
    logger = logging.getLogger("portal.anything")
    with console() as lines:
        logger.warning("fetched %s", f"https://gpus.example.org{path}", extra={"url": path})
        try:
            raise ValueError(f"could not render {path}")
        except ValueError:
            logger.exception("feed failed")

    written = lines.getvalue()
    assert secret_of(path) not in written
    assert f"fetched https://gpus.example.org/feeds/{alice.pk}.mine.[redacted].ics" in written
    assert f"ValueError: could not render /feeds/{alice.pk}.mine.[redacted].ics" in written


@app.task(name="tests.feeds.log_a_feed_url")
def log_a_feed_url(path: str) -> None:
    logging.getLogger("celery.task").warning("a task saw %s", path)


def test_a_celery_task_logging_a_feed_url_goes_through_the_same_filter(alice):
    path = feed_path(alice)
    with console() as lines:
        log_a_feed_url.apply(args=[path])
    assert f"a task saw /feeds/{alice.pk}.mine.[redacted].ics" in lines.getvalue()
    assert secret_of(path) not in lines.getvalue()


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        ("GET /feeds/12.n3.abcdefgh.ics HTTP/1.1", "GET /feeds/12.n3.[redacted].ics HTTP/1.1"),
        ("/feeds/12.mine.abc.ics?x=1", "/feeds/12.mine.[redacted].ics?x=1"),
        ("/feeds/not.a-token.ics", "/feeds/[redacted].ics"),
        # One dot is a file's name, never a token (user, feed and MAC need two): a traceback keeps its paths.
        ('File "/srv/portal/feeds/ical.py", line 40', 'File "/srv/portal/feeds/ical.py", line 40'),
        ("/feeds/12%2Emine%2Eabc%2Eics", "/feeds/12.mine.[redacted].ics"),  # an encoded dot still reaches the view
        ("/feeds/12.mine.abc", "/feeds/12.mine.[redacted]"),
        ("/api/v1/feeds/rotate/", "/api/v1/feeds/rotate/"),  # no token: left alone
        ("/api/v1/feeds/", "/api/v1/feeds/"),
    ],
)
def test_what_counts_as_a_feed_secret(text, logged):
    assert redact_secrets(text) == logged


def spelled(text: str, *, every: bool = False) -> str:
    """``text`` percent-encoded: every character (in upper-case hex), or only the dots and slashes."""
    if every:
        return "".join(f"%{ord(c):02X}" for c in text)
    return text.replace(".", "%2e").replace("/", "%2F")


MAC = "Zk3" + "q" * 40


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        # The spellings the web server decodes to /feeds/… (issue 37: they answered 200 with the secret logged).
        (f"GET /%66eeds/17.mine.{MAC}.ics HTTP/1.1", "GET /feeds/17.mine.[redacted].ics HTTP/1.1"),
        (f"GET /%46EEDS/17.mine.{MAC}.ics HTTP/1.1", "GET /FEEDS/17.mine.[redacted].ics HTTP/1.1"),
        (f"/feeds%2F17.mine.{MAC}.ics", "/feeds/17.mine.[redacted].ics"),
        (f"/feeds{spelled(f'/17.mine.{MAC}.ics')}", "/feeds/17.mine.[redacted].ics"),  # mixed-case hex
        (f"/feeds/{spelled(f'17.mine.{MAC}', every=True)}.ics", "/feeds/17.mine.[redacted].ics"),
        (f"/%2566eeds%252F17%252Emine%252E{MAC}.ics", "/feeds/17.mine.[redacted].ics"),  # twice over
        # The token in a query string, plain or encoded, and spelled as the view refuses (its MAC is real all the same).
        (f"/calendar/?u=%2Ffeeds%2F17.mine.{MAC}.ics", "/calendar/?u=/feeds/17.mine.[redacted].ics"),
        (f"/calendar/?t=17.mine.{MAC}", "/calendar/?t=17.mine.[redacted]"),
        (f"/FEEDS/0017.MINE.{MAC}.ics", "/FEEDS/0017.MINE.[redacted].ics"),
        (f"/elsewhere/{MAC}", "/elsewhere/[redacted]"),  # a MAC alone
        # A decoded newline or quote is escaped again: no forged log line.
        (f"/feeds/17.mine.{MAC}.ics?x=%0A%22", "/feeds/17.mine.[redacted].ics?x=%0A%22"),
        (f"/%66eeds/17.mine.{MAC}.ics?x=%0A%22", "/feeds/17.mine.[redacted].ics?x=%0A%22"),
        # Nothing secret: left as the client spelled it.
        ("/static/css/a%20b.css", "/static/css/a%20b.css"),
        ("/api/v1/%72eservations/?x=%0A", "/api/v1/%72eservations/?x=%0A"),
        ("tests/reservations/test_it_refuses_an_overlapping_booking_when_the_gpus_are_taken", None),
        ("sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", None),
        # The OIDC callback's code and state, and an API token put in a URL (accounts/redaction.py).
        (
            "GET /oidc/callback/?code=Sp1xl0g&state=qW3rty HTTP/1.1",
            "GET /oidc/callback/?code=[redacted]&state=[redacted] HTTP/1.1",
        ),
        ("GET /oidc/callback/?%63ode=Sp1xl0g&STATE=qW3rty", "GET /oidc/callback/?code=[redacted]&STATE=[redacted]"),
        ("/api/v1/me/?access_token=gpb_Zk3qWerty12", "/api/v1/me/?access_token=gpb_[redacted]"),
    ],
)
def test_every_spelling_of_a_secret_is_redacted(text, logged):
    assert redact_secrets(text) == (text if logged is None else logged)


# What a client can put in a path to make the redaction costly: no escape at all after a "%" ("%zz", "%2": each
# character began a match that scanned the rest of the word), escapes everywhere, runs the MAC, token, feed path,
# OIDC and API token patterns look at, and words cut short by quotes.
HOSTILE = ["%zz", "%2", "%41", "/feeds/%2e", "a", "a-", "aB1", "1.mine.", "1.n1", "/feeds/1..", "?code=", "gpb_", '"%4']


def redaction_cost(text: str) -> float:
    """The CPU time of redacting ``text``, the least of a few: a thread's own time, which a busy machine running
    other processes does not add to, and the least of several is the one its caches disturbed least."""
    return min(timeit.repeat(lambda: redact_secrets(text), number=1, repeat=5, timer=time.thread_time))


@pytest.mark.parametrize("piece", HOSTILE)
def test_redacting_a_line_costs_in_proportion_to_its_length(piece):
    """Review of issue 37: a path of 16 KB of "%zz" took 0.9 s to redact, 32 KB 3.3 s (quadratic), in the web
    worker, twice a request. Eight times the line may now cost about eight times as much, never 64: the bound of 20
    leaves room for a noisy machine, and a try over it is measured again before it counts."""

    def access_line(size: int) -> str:
        return f'127.0.0.1:4711 - - [01/Jan/2027:00:00:00] "GET /{piece * (size // len(piece))} HTTP/1.1" 404 9'

    short, long = access_line(4 * 1024), access_line(32 * 1024)
    for _ in range(3):
        ratio = redaction_cost(long) / redaction_cost(short)
        if ratio < 20:
            break
    assert ratio < 20, f"32 KB of {piece!r} cost {ratio:.0f} times what 4 KB did"


def test_a_word_with_escapes_longer_than_any_request_line_is_written_as_its_length():
    """Not decoded and looked at: somebody's probe, whose redaction must stay cheap."""
    probe = "/" + "%41" * 3000
    assert redact_secrets(f"GET {probe} HTTP/1.1") == "GET [redacted: 9001 characters with percent escapes] HTTP/1.1"
    normal = "/" + "%41" * 2000  # a long URL a server accepts is still decoded, and left as sent when nothing is secret
    assert redact_secrets(f"GET {normal} HTTP/1.1") == f"GET {normal} HTTP/1.1"


# The web server as deployed: portal/serve.py in a subprocess.


def serve(tmp_path, **environment: str) -> tuple[subprocess.Popen[bytes], str, object]:
    port = free_port()
    log = (tmp_path / "web.log").open("wb")
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "LOG_FORMAT"}}
    env.update(VAR_DIR=str(tmp_path), SECRET_KEY=settings.SECRET_KEY, **environment)
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
        [sys.executable, "-m", "portal.serve", "-b", "127.0.0.1", "-p", str(port), "portal.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    if not wait_for(lambda: port_open(port) or process.poll() is not None, timeout=30, interval=0.1):
        process.kill()
    return process, f"http://127.0.0.1:{port}", log


def test_the_web_servers_access_and_request_lines_are_json_and_hold_no_feed_secret(tmp_path):
    # A token of the wrong length is refused before any database read, so this server needs none.
    path = f"/feeds/1.mine.{FORGED_MAC[:-1]}.ics"
    process, url, log = serve(tmp_path, LOG_FORMAT="json")
    try:
        assert requests.get(f"{url}{path}", timeout=10).status_code == 404
        written = lambda: (tmp_path / "web.log").read_text()  # noqa: E731
        assert wait_for(lambda: '"daphne.access"' in written(), timeout=10), written()
    finally:
        process.terminate()
        process.wait(10)
        log.close()

    records = [json.loads(line) for line in written().splitlines() if line.startswith("{")]
    access = next(r for r in records if r["logger"] == "daphne.access")
    assert access["request_line"] == "GET /feeds/1.mine.[redacted].ics"
    assert '"GET /feeds/1.mine.[redacted].ics" 404' in access["message"]
    assert access["status_code"] == 404
    not_found = next(r for r in records if r["logger"] == "django.request")
    assert not_found["message"] == "Not Found: /feeds/1.mine.[redacted].ics"
    assert not_found["path"] == "/feeds/1.mine.[redacted].ics"
    assert FORGED_MAC[:-1] not in written()


@pytest.mark.postgres_only
def test_daphne_logs_a_real_feed_fetch_without_its_secret(asgi_server):
    subscriber = UserFactory(username="subscriber")
    path = feed_path(subscriber)

    assert requests.get(f"{asgi_server.url}{path}", timeout=10).status_code == 200
    assert requests.get(f"{asgi_server.url}/feeds/{subscriber.pk}.mine.{FORGED_MAC}.ics", timeout=10).status_code == 404

    redacted = f'"GET /feeds/{subscriber.pk}.mine.[redacted].ics" '
    assert wait_for(lambda: asgi_server.log().count(redacted) == 2, timeout=10), asgi_server.log()
    assert f"{redacted}200" in asgi_server.log()
    assert secret_of(path) not in asgi_server.log()
    assert FORGED_MAC not in asgi_server.log()


@pytest.mark.postgres_only
def test_daphne_logs_no_secret_of_an_encoded_feed_url(asgi_server):
    """Issue 37: daphne decodes the path before the portal routes it, so these answer like the plain URL, while
    its access line holds the spelling the client sent."""
    subscriber = UserFactory(username="subscriber")
    path = feed_path(subscriber)
    token = path.removeprefix("/feeds/").removesuffix(".ics")
    answers = {
        f"/%66eeds/{token}.ics": 200,
        f"/feeds%2F{token}.ics": 200,
        f"/feeds{spelled(f'/{token}.ics')}": 200,  # %2F and %2e, hex in both cases
        f"/feeds/{spelled(token, every=True)}.ics": 200,
        f"{path}?again={spelled(path)}": 200,
        f"/%2566eeds/{token}.ics": 404,  # decoded once, as daphne does: not a feed, but its secret is real
    }
    for spelling, status in answers.items():
        assert requests.get(f"{asgi_server.url}{spelling}", timeout=10).status_code == status, spelling

    assert wait_for(lambda: asgi_server.log().count(f"/feeds/{subscriber.pk}.mine.[redacted].ics") >= 6, timeout=10), (
        asgi_server.log()
    )
    written = asgi_server.log()
    decoded = unquote(unquote(unquote(written)))
    assert secret_of(path) not in decoded, written
    assert secret_of(path).lower() not in decoded.lower(), written
