"""Ending real processes that run as real users, and refusing the ones the agent must never touch."""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest

from gpubook_agent import cleanup, procfs
from gpubook_agent.cleanup import Holder
from tests.agent.conftest import UnixUser

FAST = {"term_timeout": 2.0, "kill_retries": 2, "kill_timeout": 2.0}  # returns as soon as the process is gone
ALLOW = frozenset({"dcgm-monitor"})  # an account, not a process name
DAEMON = UnixUser("daemon", 1, 1)  # a system account on every Debian


def _protected(holder: Holder) -> bool:
    return cleanup.protected(holder, allow_users=ALLOW, own_pid=os.getpid(), uid_min=procfs.uid_min())


def test_a_process_ends_on_sigterm(open_device, unix_users, spawn):
    holder = spawn(open_device, user=unix_users[0])
    result = cleanup.terminate([holder.pid], **FAST)
    assert result == cleanup.TerminationResult(ended=[holder.pid], unkillable=[], refused=[])
    assert holder.wait(timeout=10) == -signal.SIGTERM


def test_a_process_that_ignores_sigterm_ends_by_sigkill(open_device, unix_users, spawn):
    holder = spawn(open_device, user=unix_users[0], ignore_term=True)
    result = cleanup.terminate([holder.pid], term_timeout=0.3, kill_retries=2, kill_timeout=2.0)
    assert result.ended == [holder.pid]
    assert result.unkillable == []
    assert holder.wait(timeout=10) == -signal.SIGKILL


def test_what_outlives_every_signal_is_unkillable(open_device, unix_users, spawn):
    # No SIGKILL round: the stand-in for a process stuck in uninterruptible sleep in the driver.
    holder = spawn(open_device, user=unix_users[0], ignore_term=True)
    result = cleanup.terminate([holder.pid], term_timeout=0.2, kill_retries=0)
    assert result == cleanup.TerminationResult(ended=[], unkillable=[holder.pid], refused=[])
    assert holder.poll() is None


def test_several_processes_end_together(open_device, unix_users, spawn):
    calm = spawn(open_device, user=unix_users[0])
    stubborn = spawn(open_device, user=unix_users[1], ignore_term=True)
    result = cleanup.terminate([calm.pid, stubborn.pid, calm.pid], term_timeout=0.3, kill_retries=1)
    assert sorted(result.ended) == sorted([calm.pid, stubborn.pid])
    assert calm.wait(timeout=10) == -signal.SIGTERM
    assert stubborn.wait(timeout=10) == -signal.SIGKILL


def test_a_pid_that_is_already_gone_counts_as_ended(open_device, unix_users, spawn):
    holder = spawn(open_device, user=unix_users[0])
    holder.kill()
    holder.wait(timeout=10)
    assert cleanup.terminate([holder.pid], **FAST).ended == [holder.pid]


def test_an_exited_but_unreaped_process_counts_as_ended_without_a_signal(open_device, unix_users, spawn):
    holder = spawn(open_device, user=unix_users[0])
    holder.kill()  # and do not wait for it: it stays a zombie until the wait below
    _wait_for_zombie(holder.pid)
    assert cleanup.terminate([holder.pid], **FAST).ended == [holder.pid]
    assert holder.wait(timeout=10) == -signal.SIGKILL


def test_terminate_refuses_a_root_process(open_device, spawn):
    holder = spawn(open_device, user=None)
    result = cleanup.terminate([holder.pid], term_timeout=0.2, kill_retries=1, kill_timeout=0.2)
    assert result == cleanup.TerminationResult(ended=[], unkillable=[], refused=[holder.pid])
    assert holder.poll() is None


def test_terminate_refuses_itself_and_init():
    result = cleanup.terminate([os.getpid(), 1, 0, -1], term_timeout=0.1, kill_retries=0)
    assert result == cleanup.TerminationResult(ended=[], unkillable=[], refused=[os.getpid(), 1, 0, -1])


def test_terminate_refuses_a_thread_id():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert thread.native_id is not None
        result = cleanup.terminate([thread.native_id], term_timeout=0.1, kill_retries=0)
        assert result.refused == [thread.native_id]
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join()


def test_a_user_process_is_described_and_not_protected(open_device, unix_users, spawn):
    alice = unix_users[0]
    holder = spawn(open_device, user=alice, name="train.py")
    gone = spawn(open_device, user=alice)
    gone.kill()
    gone.wait(timeout=10)
    described = cleanup.describe([holder.pid, gone.pid])
    assert described == [Holder(pid=holder.pid, uid=alice.uid, user=alice.name, name="train.py")]
    assert not _protected(cleanup.describe([holder.pid])[0])


def test_root_and_system_accounts_are_protected(open_device, spawn):
    as_root = spawn(open_device, user=None)
    as_daemon = spawn(open_device, user=DAEMON)
    by_root, by_daemon = cleanup.describe([as_root.pid, as_daemon.pid])
    assert (by_root.uid, by_daemon.uid, by_daemon.user) == (0, 1, "daemon")
    assert _protected(by_root)
    assert _protected(by_daemon)
    below = Holder(pid=4242, uid=1500, user="old", name="x")
    assert cleanup.protected(below, allow_users=ALLOW, own_pid=1, uid_min=2000)


def test_allow_listed_accounts_and_the_agent_itself_are_protected(unix_users):
    user = unix_users[0]
    assert cleanup.protected(
        Holder(pid=4242, uid=user.uid, user=user.name, name="exporter"),
        allow_users=frozenset({user.name}),
        own_pid=1,
        uid_min=1000,
    )
    assert _protected(Holder(pid=os.getpid(), uid=user.uid, user=user.name, name="python"))


@pytest.mark.parametrize("name", ["nvidia-smi", "dcgmi", "nvidia-persiste", "dcgm-exporter"])
def test_a_process_name_protects_nothing_as_any_process_can_take_one(open_device, unix_users, spawn, name):
    job = spawn(open_device, user=unix_users[0], name=name)
    (holder,) = cleanup.describe([job.pid])
    assert holder.name == name[:15]
    assert not _protected(holder)


def _wait_for_zombie(pid: int) -> None:
    """Until /proc says the process is a zombie (State: Z), bounded by a pidfd wait for its exit."""
    fd = os.pidfd_open(pid)
    try:
        assert select.select([fd], [], [], 10)[0], "the process did not exit"
    finally:
        os.close(fd)
    status = procfs.process_status(pid)
    assert status is not None and status["State"].startswith("Z")
