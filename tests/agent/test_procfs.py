"""Reading real processes from /proc: a user's process holding the stand-in device file."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile

from gpubook_agent import procfs


def test_fd_holders_finds_a_process_holding_the_file_and_forgets_it_once_it_exits(open_device, unix_users, spawn):
    holder = spawn(open_device, user=unix_users[0])
    link = os.path.join(os.path.dirname(open_device), "nvidia-link")
    os.symlink(open_device, link)
    assert procfs.fd_holders([open_device, link]) == {open_device: {holder.pid}, link: {holder.pid}}

    holder.kill()
    holder.wait(timeout=10)
    assert procfs.fd_holders([open_device]) == {open_device: set()}


def test_fd_holders_of_nothing_is_empty():
    assert procfs.fd_holders([]) == {}


def test_a_process_is_described_by_its_real_uid_and_short_name(open_device, unix_users, spawn):
    alice = unix_users[0]
    holder = spawn(open_device, user=alice, name="gpbt-train")
    assert procfs.process_uid(holder.pid) == alice.uid
    assert procfs.process_uids(holder.pid) == (alice.uid,) * 4
    assert procfs.process_name(holder.pid) == "gpbt-train"
    assert procfs.user_name(alice.uid) == alice.name
    assert procfs.uid_of(alice.name) == alice.uid


def test_a_process_that_is_gone_reads_as_none(open_device, unix_users, spawn):
    holder = spawn(open_device, user=unix_users[0])
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert procfs.process_uid(holder.pid) is None
    assert procfs.process_name(holder.pid) is None


def test_unknown_accounts_read_as_none():
    assert procfs.user_name(2**31 - 2) is None
    assert procfs.uid_of("gpbt_nosuchuser") is None
    assert procfs.uid_of("bad\x00name") is None


def test_uid_min_comes_from_login_defs(tmp_path):
    defs = tmp_path / "login.defs"
    defs.write_text("# UID_MIN 5\nMAIL_DIR /var/mail\nUID_MIN\t\t\t 2000\nUID_MAX 60000\n")
    assert procfs.uid_min(str(defs)) == 2000
    defs.write_text("UID_MIN 0x3E8\n")
    assert procfs.uid_min(str(defs)) == 1000
    defs.write_text("UID_MIN 500\nUID_MIN 1500\n")
    assert procfs.uid_min(str(defs)) == 1500  # the last one wins, as for shadow's tools
    for broken in ("UID_MIN lots\n", "UID_MIN 0\n", "UID_MAX 60000\n", ""):
        defs.write_text(broken)
        assert procfs.uid_min(str(defs)) == 1000
    assert procfs.uid_min(str(tmp_path / "missing")) == 1000


def test_fd_holders_finds_a_holder_under_a_hard_link_and_no_other_file(open_device, unix_users, spawn):
    link = os.path.join(os.path.dirname(open_device), "other-name")
    os.link(open_device, link)
    lookalike = os.path.join(os.path.dirname(open_device), "nvidia0.copy")
    shutil.copy(open_device, lookalike)
    os.chmod(lookalike, 0o666)  # noqa: S103 - the test user opens it
    through_link = spawn(link, user=unix_users[0])
    on_the_copy = spawn(lookalike, user=unix_users[1])

    assert procfs.fd_holders([open_device]) == {open_device: {through_link.pid}}
    assert on_the_copy.pid not in procfs.fd_holders([open_device])[open_device]


def test_fd_holders_knows_a_character_device_by_its_number_whatever_node_was_opened(unix_users, spawn):
    # Another device node for the same device (as a container's /dev has): /dev/null's number under a new name.
    directory = tempfile.mkdtemp(prefix="gpbt-", dir="/tmp")
    try:
        os.chmod(directory, 0o755)  # noqa: S103 - the test user must reach the node
        alias = os.path.join(directory, "my-null")
        os.mknod(alias, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(alias, 0o666)  # noqa: S103 - the test user opens it
        holder = spawn(alias, user=unix_users[0])

        assert holder.pid in procfs.fd_holders(["/dev/null"])["/dev/null"]
        assert procfs.file_identity(alias) == procfs.file_identity("/dev/null") == ("char", 1, 3, 0)
        assert procfs.file_identity(f"/proc/{holder.pid}/fd/3") == procfs.file_identity("/dev/null")
    finally:
        shutil.rmtree(directory)


def test_the_identity_of_a_file_that_is_gone_is_none(tmp_path):
    assert procfs.file_identity(str(tmp_path / "missing")) is None
