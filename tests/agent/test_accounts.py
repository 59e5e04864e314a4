"""Which accounts a node gives GPUs to: looked up for real (NSS), by uid, cached a minute."""

# ruff: noqa: S603, S607

from __future__ import annotations

import os
import pwd
import secrets
import subprocess

import pytest

from gpubook_agent import accounts
from gpubook_agent.accounts import AccountCheck


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_ordinary_account_is_accepted(unix_users):
    assert AccountCheck(uid_min=1000).refusal(unix_users[0].name) is None


@pytest.mark.parametrize("name", ["root", "daemon", "www-data"])
def test_accounts_below_uid_min_are_refused_with_their_uid(name):
    uid = pwd.getpwnam(name).pw_uid

    assert AccountCheck(uid_min=1000).refusal(name) == (
        f"{name!r} is a system account on this node (uid {uid} is below UID_MIN 1000)"
    )


def test_nobody_is_refused_although_its_uid_is_high():
    assert pwd.getpwnam("nobody").pw_uid >= 1000
    assert "'nobody' account" in AccountCheck(uid_min=1000).refusal("nobody")


def test_an_account_the_node_lacks_is_refused():
    ghost = f"gpbt_ghost{secrets.token_hex(3)}"

    assert AccountCheck(uid_min=1000).refusal(ghost) == f"there is no account {ghost!r} on this node"


def test_uid_min_is_the_nodes_own(unix_users):
    user = unix_users[0]

    assert AccountCheck(uid_min=user.uid + 1).refusal(user.name) is not None


def test_an_account_created_later_is_accepted_once_the_cache_expires():
    """The answer is cached (the enforcer asks on every pass), for a minute at most."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates an account")
    name = f"gpbt_late{secrets.token_hex(3)}"
    ticks = Ticks()
    check = AccountCheck(uid_min=1000, clock=ticks)
    assert check.refusal(name) is not None
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        ticks.now = accounts.CACHE_SECONDS - 1
        assert check.refusal(name) is not None  # still the cached answer
        ticks.now = accounts.CACHE_SECONDS + 1
        assert check.refusal(name) is None
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
