"""Named people and a frozen clock, after healthchecks' BaseTestCase.

alice and bob are researchers, carol is an admin. ``clock`` freezes time on a Monday at 09:00 UTC
(on the booking grid) so every period in a test reads as plain numbers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nodes.models import Node
from tests.factories import UserFactory, node_with_gpus

MONDAY_9 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Real hashing costs about a second per user created; the tests are not about it."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
