from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from accounts import validators
from gpubook_agent import usernames
from gpubook_agent.usernames import valid_username

SAMPLES = ["alice", "_svc", "a", "bob-2", "a" * 32, "a" * 33, "", "Alice", "9lives", "-rf", "alice\n", "al ice",
           "../x", "ålice", "alice\x00", "a:b", "root", "nobody", "nvidia-persistenced", "1000"]  # fmt: skip


def test_the_portal_and_the_agent_use_one_rule():
    assert usernames.UNIX_USERNAME_RE.pattern == validators.UNIX_USERNAME_RE.pattern
    assert usernames.UNIX_USERNAME_RE.flags == validators.UNIX_USERNAME_RE.flags


@pytest.mark.parametrize("name", SAMPLES)
def test_the_agent_accepts_every_name_the_portal_accepts(name, settings):
    """The agent checks syntax only; the portal also refuses its deny list (and the node refuses
    accounts it does not have or whose uid is below UID_MIN, tests/agent/test_accounts.py)."""
    try:
        validators.validate_unix_username(name)
    except ValidationError:
        portal_accepts = False
    else:
        portal_accepts = True
    if portal_accepts:
        assert valid_username(name)
    else:
        assert not valid_username(name) or name in settings.UNIX_USERNAME_DENYLIST


@pytest.mark.parametrize("name", ["root", "www-data", "postgres", "nobody", "nvidia-persistenced"])
def test_the_portal_refuses_service_accounts_by_default(name):
    with pytest.raises(ValidationError, match="system or service account"):
        validators.validate_unix_username(name)


def test_the_deny_list_is_a_setting(settings):
    settings.UNIX_USERNAME_DENYLIST = frozenset({"labadmin"})
    with pytest.raises(ValidationError, match="system or service account"):
        validators.validate_unix_username("labadmin")
    validators.validate_unix_username("postgres")  # no longer listed: the node's uid rule still applies


@pytest.mark.parametrize("value", [None, 42, b"alice", ["alice"]])
def test_only_strings_are_usernames(value):
    assert valid_username(value) is False
