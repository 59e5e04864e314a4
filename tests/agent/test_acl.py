"""Granting and revoking a GPU through real ACLs on a real file, checked with the real getfacl."""

# ruff: noqa: S603, S607

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

from gpubook_agent import acl
from gpubook_agent.acl import AclError
from tests.agent.conftest import read_line
from tests.agent.harness import getfacl


def test_grant_lets_the_user_open_the_device_and_revoke_stops_new_opens(device, unix_users, try_open, spawn):
    alice = unix_users[0]
    assert try_open(device, alice) == "denied"

    acl.grant(device, alice.name)
    assert f"user:{alice.name}:rw-" in getfacl(device).splitlines()
    assert acl.granted_users(device) == {alice.name}
    assert try_open(device, alice) == "opened"
    holder = spawn(device, user=alice)

    acl.revoke(device, alice.name)
    assert f"user:{alice.name}:" not in getfacl(device)
    assert acl.granted_users(device) == set()
    assert try_open(device, alice) == "denied"
    holder.stdin.write("still here\n")
    holder.stdin.flush()
    assert read_line(holder) == "wrote"  # the fd opened before the revoke still works: cleanup's job
    with open(device) as file:
        assert file.read() == "still here\n"


def test_grants_are_per_user(device, unix_users, try_open):
    alice, bob = unix_users[0], unix_users[1]
    acl.grant(device, alice.name)
    acl.grant(device, bob.name)
    assert acl.granted_users(device) == {alice.name, bob.name}

    acl.revoke(device, alice.name)
    assert acl.granted_users(device) == {bob.name}
    assert try_open(device, alice) == "denied"
    assert try_open(device, bob) == "opened"


def test_granting_twice_and_revoking_an_absent_entry_are_fine(device, unix_users):
    alice = unix_users[0]
    acl.grant(device, alice.name)
    acl.grant(device, alice.name)
    assert acl.granted_users(device) == {alice.name}
    acl.revoke(device, alice.name)
    acl.revoke(device, alice.name)
    acl.revoke(device, unix_users[1].name)
    assert acl.granted_users(device) == set()


def test_grant_restores_write_access_narrowed_by_the_mask(device, unix_users, try_open):
    alice = unix_users[0]
    acl.grant(device, alice.name)
    subprocess.run(["setfacl", "-m", "m::r", "--", device], check=True)
    assert try_open(device, alice) == "denied"
    acl.grant(device, alice.name)
    assert try_open(device, alice) == "opened"


@pytest.mark.parametrize(
    "name",
    ["../x", "a b", "alice\n", "-rf", "", "Alice", "a:b", "bob,u:eve:rw",
     "x" * 33, "1\uff10", 42, None],
)  # fmt: skip
@pytest.mark.parametrize("action", [acl.grant, acl.revoke])
def test_an_invalid_username_is_refused_before_anything_runs(device, monkeypatch, name, action):
    before = getfacl(device)
    calls = []
    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append(args))
        patch.setattr(subprocess, "Popen", lambda *args, **kwargs: calls.append(args))
        with pytest.raises(AclError, match="not a username"):
            action(device, name)
    assert calls == []
    assert getfacl(device) == before


def test_an_entry_left_by_a_deleted_account_shows_as_its_uid_and_can_be_revoked(device):
    uid = next(uid for uid in range(61000, 62000) if not _has_account(uid))
    subprocess.run(["setfacl", "-m", f"u:{uid}:rw", "--", device], check=True)
    assert acl.granted_users(device) == {str(uid)}
    with pytest.raises(AclError, match="not a username"):
        acl.grant(device, str(uid))  # a uid is only ever removed, never given

    acl.revoke(device, str(uid))
    assert acl.granted_users(device) == set()


def test_granting_to_an_unknown_user_says_so(device):
    before = getfacl(device)
    with pytest.raises(AclError, match=r"there is no user 'gpbt_nosuchuser' on this node \(setfacl: .*\)"):
        acl.grant(device, "gpbt_nosuchuser")
    assert getfacl(device) == before


def test_a_filesystem_without_acls_is_an_error_with_setfacls_message(unix_users):
    assert not acl.acls_supported("/proc/version")
    with pytest.raises(AclError, match="Operation not supported"):
        acl.grant("/proc/version", unix_users[0].name)


def test_a_missing_device_is_an_error(unix_users, tmp_path):
    missing = str(tmp_path / "nvidia9")
    with pytest.raises(AclError, match="No such file"):
        acl.grant(missing, unix_users[0].name)
    with pytest.raises(AclError, match="No such file"):
        acl.granted_users(missing)


def test_a_path_that_looks_like_an_option_is_still_a_path(device, unix_users, monkeypatch):
    monkeypatch.chdir(os.path.dirname(device))
    os.rename(device, "-x")
    acl.grant("-x", unix_users[0].name)
    assert acl.granted_users("-x") == {unix_users[0].name}
    acl.revoke("-x", unix_users[0].name)
    assert acl.granted_users("-x") == set()
    os.rename("-x", device)


def test_without_the_acl_tools_the_error_says_what_to_install(device, unix_users, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AclError, match="install the 'acl' package"):
        acl.grant(device, unix_users[0].name)
    assert acl.granted_users(device) == set()  # reading needs no tool: it asks the kernel


def test_acls_are_supported_on_the_stand_in_device(device):
    assert acl.acls_supported(device)
    assert not acl.acls_supported(device + ".missing")


def test_the_named_users_read_from_the_kernel_match_getfacl(device, unix_users):
    alice, bob, _ = unix_users
    deleted = next(uid for uid in range(60000, 61000) if not _has_account(uid))
    entries = f"u:{alice.name}:rw,u:{bob.name}:r,u:{deleted}:rw,g:video:rw,m::rw"
    subprocess.run(["setfacl", "-m", entries, "--", device], check=True)

    named = {line.split(":")[1] for line in getfacl(device).splitlines() if line.startswith("user:")} - {""}
    assert named == {alice.name, bob.name, str(deleted)}
    assert acl.granted_users(device) == named


def test_a_malformed_acl_attribute_is_an_error_not_a_guess():
    with pytest.raises(AclError, match="unexpected ACL attribute"):
        acl.parse_xattr_user_ids(b"\x02\x00\x00\x00\x01")
    with pytest.raises(AclError, match="version"):
        acl.parse_xattr_user_ids(b"\x01\x00\x00\x00")


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
