"""Named people and a frozen clock, after healthchecks' BaseTestCase.

alice and bob are researchers, carol is an admin. ``clock`` freezes time on a Monday at 09:00 UTC
(on the booking grid) so every period in a test reads as plain numbers.
"""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from nodes.models import Node
from tests.factories import UserFactory, book, node_with_gpus

MONDAY_9 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)


# Nodes' broker users (nodes/broker_users.py) are Redis ACL users: one set per Redis server, not per
# database, so test runs sharing a Redis would replace each other's. Tests run in single-credential mode,
# the portal processes they start included (their environment is this one); the tests of the broker users
# turn it on against a redis-server of their own (tests/nodes/test_broker_users.py).
os.environ["NODE_BROKER_USERS"] = "false"
# And every user a test makes carries this run's own prefix (nodes/broker_users.py), so that no test, and no
# portal process a test starts, can touch a running portal's users, nor the other runs' beside it
# (tests/nodes/test_portals_apart.py).
TEST_BROKER_USER_PREFIX = f"gpubook-test-{secrets.token_hex(4)}."
os.environ["NODE_BROKER_USER_PREFIX"] = TEST_BROKER_USER_PREFIX
# A booking's status cards are built by a worker, coalesced (live/status.py). Most tests run no worker: the
# cards are built at once, in the process that booked, as with LIVE_STATUS_COALESCE_MS=0, the portal processes
# they start included. tests/live/test_status_coalescing.py runs the worker's path.
os.environ["LIVE_STATUS_COALESCE_MS"] = "0"
# Telemetry is queued for the ingest process in production (nodes/telemetry_queue.py). Most tests run none:
# the web process stores each report before answering (TELEMETRY_INGEST=inline, the same batch code with one
# report), the portal processes they start included. tests/nodes/test_telemetry_queue.py and
# tests/live/test_telemetry_ingest.py run the queue and the ingest process.
os.environ["TELEMETRY_INGEST"] = "inline"


@pytest.fixture(autouse=True)
def single_broker_credential(settings):
    settings.NODE_BROKER_USERS = False
    settings.NODE_BROKER_USER_PREFIX = TEST_BROKER_USER_PREFIX


@pytest.fixture(autouse=True)
def telemetry_stored_inline(settings):
    settings.TELEMETRY_INGEST = "inline"


@pytest.fixture(autouse=True)
def status_cards_at_once(settings):
    settings.LIVE_STATUS_COALESCE_SECONDS = 0


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Real hashing costs about a second per user created; the tests are not about it."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    """The rate limits live in the Redis cache (kernel/cache.py), which outlives a test: each test starts
    with nothing counted. Only the cache's own keys go: cache.clear() would empty the whole Redis database
    (the broker's queues with it)."""
    from django.conf import settings
    from django.core.cache import cache

    client = cache._cache.get_client(None, write=True)
    for key in client.scan_iter(f"{settings.CACHES['default']['KEY_PREFIX']}:*"):
        client.delete(key)


@pytest.fixture(autouse=True)
def fresh_token_throttle():
    """Failed API tokens are counted per client address in Redis (accounts/throttling.py), which
    outlives a test, and the frozen clock puts many tests in the same minute: each test starts with
    none counted, so one test's wrong tokens never throttle another's."""
    from accounts.throttling import FAILED_TOKENS_PATTERN
    from kernel.redis_client import redis_client

    for key in redis_client().scan_iter(FAILED_TOKENS_PATTERN):
        redis_client().delete(key)


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def bob(db):
    return UserFactory(username="bob")


@pytest.fixture
def carol(db):
    return UserFactory(username="carol", is_staff=True, is_superuser=True)


@pytest.fixture
def node(db) -> Node:
    return node_with_gpus(4, name="gpu-a100")


@pytest.fixture
def gpus(node):
    return list(node.gpus.order_by("index"))


@pytest.fixture
def clock(time_machine):
    """Time frozen at MONDAY_9; move it with clock.shift(timedelta) or clock.move_to(datetime)."""
    time_machine.move_to(MONDAY_9, tick=False)
    return time_machine


def at(hours: float = 0, days: float = 0) -> datetime:
    """A moment relative to MONDAY_9."""
    return MONDAY_9 + timedelta(hours=hours, days=days)


@pytest.fixture
def asgi_server(transactional_db):
    """daphne serving portal.asgi (tests/live/server.py) on the test database. The server reads
    over its own connections, so the test's writes must be committed (transactional_db)."""
    from tests.live.server import AsgiServer

    if connection.vendor != "postgresql":
        pytest.skip("the ASGI server subprocess shares the test database: PostgreSQL only")
    server = AsgiServer(LIVE_RECHECK_SECONDS="1")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def live_lab(transactional_db):
    """For the live tests: node live-a100 with two GPUs and its agent's token; researcher rita and
    admin adam, each with an API token."""
    from accounts.services import api_token_create
    from nodes.history import forget_all
    from nodes.models import Gpu
    from nodes.services import node_register

    forget_all()  # a test database reuses GPU ids: no sparkline left from an earlier run

    credentials = node_register(name="live-a100", hostname="a100.lab")
    gpus = [
        Gpu.objects.create(node=credentials.node, index=i, uuid=f"GPU-live-{i}", model="NVIDIA A100", memory_mib=81920)
        for i in range(2)
    ]
    researcher = UserFactory(username="rita")
    admin = UserFactory(username="adam", is_staff=True)
    return {
        "node": credentials.node,
        "agent_token": credentials.agent_token,
        "gpus": gpus,
        "researcher": researcher,
        "admin": admin,
        "researcher_token": api_token_create(user=researcher, name="ws")[1],
        "admin_token": api_token_create(user=admin, name="ws")[1],
    }


@pytest.fixture
def smtp_server(settings):
    """A real SMTP server (aiosmtpd) the portal sends its mail to, over SMTP, during the test."""
    from tests.mailserver import MailServer

    server = MailServer()
    server.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    yield server
    server.stop()


@pytest.fixture
def booked(smtp_server):
    """``book()``, then let the booking's confirmation go (the mail outbox) and forget that mail: for
    the tests of the mails that come later."""
    from notifications.services import outbox_drain

    def book_and_forget_the_confirmation(*args, **kwargs):
        reservation = book(*args, **kwargs)
        outbox_drain()
        smtp_server.clear()
        return reservation

    return book_and_forget_the_confirmation
