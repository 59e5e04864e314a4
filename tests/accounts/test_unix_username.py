from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from accounts.validators import validate_unix_username
from tests.factories import UserFactory


@pytest.mark.parametrize("name", ["alice", "_svc", "a", "bob-2", "x_y-z9", "a" * 32])
def test_it_accepts_ordinary_unix_usernames(name):
    validate_unix_username(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Alice",
        "9lives",
        "-rf",
        "a" * 33,
        "alice\n",
        "al ice",
        "al;ice",
        "al/ice",
        "ålice",
        "$(id)",
        "a.b",
        "alice\x00",
    ],
)
def test_it_refuses_anything_else(name):
    with pytest.raises(ValidationError, match="is not a valid unix username"):
        validate_unix_username(name)


@pytest.mark.parametrize("name", ["root", "nobody", "daemon"])
def test_it_refuses_system_accounts(name):
    with pytest.raises(ValidationError, match="is a system or service account"):
        validate_unix_username(name)


def test_the_model_validates_it(db):
    user = UserFactory.build(username="mallory", unix_username="Mallory")
    with pytest.raises(ValidationError) as refused:
        user.full_clean()
    assert "unix_username" in refused.value.message_dict


def test_unix_usernames_are_unique_but_may_be_left_empty(db):
    UserFactory(username="alice", unix_username="alice")
    UserFactory(username="x1", unix_username=None)
    UserFactory(username="x2", unix_username=None)
    with pytest.raises(IntegrityError):
        UserFactory(username="alice2", unix_username="alice")
