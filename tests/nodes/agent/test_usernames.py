from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from accounts import validators
from nodes.agent import usernames
from nodes.agent.usernames import valid_username

SAMPLES = ["alice", "_svc", "a", "bob-2", "a" * 32, "a" * 33, "", "Alice", "9lives", "-rf", "alice\n", "al ice",
           "../x", "ålice", "alice\x00", "a:b", "root", "nobody", "nvidia-persistenced", "1000"]  # fmt: skip


def test_the_portal_and_the_agent_use_one_rule():
    assert usernames.UNIX_USERNAME_RE.pattern == validators.UNIX_USERNAME_RE.pattern
    assert usernames.UNIX_USERNAME_RE.flags == validators.UNIX_USERNAME_RE.flags
    assert usernames.RESERVED_UNIX_USERNAMES == validators.RESERVED_UNIX_USERNAMES


@pytest.mark.parametrize("name", SAMPLES)
def test_the_agent_and_the_portal_agree_on_each_name(name):
    try:
        validators.validate_unix_username(name)
    except ValidationError:
        portal_accepts = False
    else:
        portal_accepts = True
    assert valid_username(name) is portal_accepts


@pytest.mark.parametrize("value", [None, 42, b"alice", ["alice"]])
def test_only_strings_are_usernames(value):
    assert valid_username(value) is False
