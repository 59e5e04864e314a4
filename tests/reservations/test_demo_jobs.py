"""Demo jobs: real processes of real unix users on stand-in device files that real ACLs open.

The jobs run as throwaway accounts (tests/agent/conftest.py) under the real clock: every wait
polls for what the kernel shows (/proc) with a generous timeout, never a sleep that hopes.
"""

# Tests run fixed argument lists (never a shell); the fixtures imported from tests/agent/conftest.py
# are "redefined" as arguments, which is how pytest hands them over.
# ruff: noqa: S603, F811

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from gpubook_agent import acl
from gpubook_agent.accounts import AccountCheck
from gpubook_agent.gpus.simulated import SimulatedBackend, demo_device_dir, parse_simulated_mig
from nodes.mig import simulated_layout, simulated_mig_cards_make
from nodes.models import AgentState
from reservations import demo_jobs
from reservations.demo_jobs import (
    JOB,
    JOB_COMM,
    LEFT_IDLE_PURPOSE,
    DemoJobs,
    Wanted,
    job_python,
    running_bookings,
    skip_reason,
)
from reservations.models import Reservation
from reservations.services import reservation_cancel, reservation_release
from tests.agent.conftest import UnixUser, unix_users, user_python  # noqa: F401 - fixtures
from tests.agent.harness import wait_for
from tests.factories import UserFactory, book, node_with_gpus


@pytest.fixture
def device_root() -> Iterator[str]:
    """The demo's device root, in a folder every user may traverse, with gpu-a100's four stand-ins (0660 root)."""
    parent = tempfile.mkdtemp(prefix="gpbt-jobs-", dir="/tmp")
    os.chmod(parent, 0o755)  # noqa: S103 - the test users must reach the files below
    root = os.path.join(parent, "gpubook-demo")
    SimulatedBackend(device_dir=demo_device_dir(root, "gpu-a100"), node_name="gpu-a100", count=4).close()
    os.chmod(os.path.dirname(demo_device_dir(root, "gpu-a100")), 0o755)  # noqa: S103
    os.chmod(root, 0o755)  # noqa: S103
    try:
        yield root
    finally:
        shutil.rmtree(parent)


@pytest.fixture(autouse=True)
def root_groups(unix_users) -> Iterator[None]:
    """The runner as a root login has it: root's group among its groups. A job that kept them would open the
    0660 root:root stand-ins without any ACL, and every check below would mean nothing."""
    before = os.getgroups()
    os.setgroups([0])
    try:
        yield
    finally:
        os.setgroups(before)


@pytest.fixture
def lab(db, unix_users):
    """gpu-a100, whose agent runs the simulated backend, and researcher rita, unix account unix_users[0]."""
    node = node_with_gpus(4, name="gpu-a100")
    AgentState.objects.create(node=node, last_seen=timezone.now(), backend="simulated")
    rita = UserFactory(username="rita", unix_username=unix_users[0].name)
    carol = UserFactory(username="carol", is_staff=True, is_superuser=True)
    return {"node": node, "gpus": list(node.gpus.order_by("index")), "rita": rita, "carol": carol}


@pytest.fixture
def runner(user_python) -> Iterator[DemoJobs]:
    """Always busy (no idle phase), and no second try within the test unless its clock is moved."""
    jobs = DemoJobs(python=user_python, busy_seconds=3600, idle_seconds=0, retry_seconds=3600)
    try:
        yield jobs
    finally:
        jobs.stop_all()


def now_plus(hours: float) -> datetime:
    """``hours`` from now on the real clock, which the jobs run on. Bookings around it are written directly
    (``book(direct=True)``): reservation_create refuses a start before the current grid cell, which the clock
    may just have left."""
    return timezone.now() + timedelta(hours=hours)


def paths(root: str, *indices: int) -> list[str]:
    return [os.path.join(demo_device_dir(root, "gpu-a100"), f"nvidia{index}") for index in indices]


def open_files(pid: int) -> set[str]:
    """What /proc shows ``pid`` holding open (read here, not through the code under test)."""
    try:
        return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as file:
        return dict(line.split(":\t", 1) for line in file.read().splitlines() if ":\t" in line)


def gone(pid: int) -> bool:
    try:
        return status(pid)["State"].startswith("Z")  # a zombie nobody has reaped yet is gone too
    except (OSError, KeyError):
        return True


def sync(runner: DemoJobs, root: str) -> None:
    runner.sync(running_bookings(now=timezone.now(), device_root=root))


def test_a_running_booking_gets_a_job_of_its_own_user_holding_its_gpus(lab, runner, device_root, unix_users):
    reservation = book(lab["rita"], lab["gpus"][1:3], now_plus(-1), now_plus(1), direct=True)
    for path in paths(device_root, 1, 2):
        acl.grant(path, unix_users[0].name)  # what the agent does at the slot's start

    sync(runner, device_root)
    job = runner.jobs[reservation.pk].process
    assert wait_for(lambda: set(paths(device_root, 1, 2)) <= open_files(job.pid))

    user: UnixUser = unix_users[0]
    proc = status(job.pid)
    assert proc["Uid"].split() == [str(user.uid)] * 4
    assert proc["Gid"].split() == [str(user.gid)] * 4
    assert proc["Groups"].split() == []  # none of the runner's (root's) groups
    assert proc["Name"] == JOB_COMM
    assert open_files(job.pid).isdisjoint(paths(device_root, 0, 3))

    sync(runner, device_root)  # nothing changed: the same job goes on
    assert runner.jobs[reservation.pk].process is job and job.poll() is None


def test_the_job_stops_when_the_booking_is_cancelled(lab, runner, device_root, unix_users):
    reservation = book(lab["rita"], lab["gpus"][:1], now_plus(-1), now_plus(1), direct=True)
    acl.grant(paths(device_root, 0)[0], unix_users[0].name)
    sync(runner, device_root)
    job = runner.jobs[reservation.pk].process
    assert wait_for(lambda: paths(device_root, 0)[0] in open_files(job.pid))

    reservation_cancel(reservation=reservation, actor=lab["carol"], reason="test")
    sync(runner, device_root)
    assert job.poll() is not None and gone(job.pid)
    assert runner.jobs == {}


def test_the_job_stops_when_the_booking_is_released(lab, runner, device_root, unix_users):
    reservation = book(lab["rita"], lab["gpus"][:1], now_plus(-1), now_plus(1), direct=True)
    acl.grant(paths(device_root, 0)[0], unix_users[0].name)
    sync(runner, device_root)
    job = runner.jobs[reservation.pk].process
    assert wait_for(lambda: paths(device_root, 0)[0] in open_files(job.pid))

    released = reservation_release(reservation=reservation, actor=lab["rita"])
    assert released.end < reservation.end
    # Once the released slot's end has come (it is the release time, at most rounded up to the minute).
    runner.sync(running_bookings(now=released.end, device_root=device_root))
    assert job.poll() is not None and gone(job.pid)
    assert runner.jobs == {}


def test_a_job_without_a_grant_exits_quietly_and_is_not_started_again_at_once(
    lab, user_python, device_root, unix_users, caplog
):
    now = [1000.0]
    runner = DemoJobs(python=user_python, busy_seconds=3600, idle_seconds=0, retry_seconds=30, clock=lambda: now[0])
    try:
        # The agent has granted nothing (yet).
        reservation = book(lab["rita"], lab["gpus"][:1], now_plus(-1), now_plus(1), direct=True)
        sync(runner, device_root)
        job = runner.jobs[reservation.pk].process
        assert job.wait(timeout=30) == demo_jobs.EXIT_NO_ACCESS
        for _ in range(5):
            sync(runner, device_root)
        assert runner.jobs == {}  # no spinning: one try per retry period
        assert sum("could not open" in record.getMessage() for record in caplog.records) == 1

        acl.grant(paths(device_root, 0)[0], unix_users[0].name)  # the agent catches up
        now[0] += 31
        sync(runner, device_root)
        job = runner.jobs[reservation.pk].process
        assert wait_for(lambda: paths(device_root, 0)[0] in open_files(job.pid))
    finally:
        runner.stop_all()


def test_only_approved_bookings_running_on_simulated_nodes_get_jobs(lab, device_root, unix_users):
    running = book(lab["rita"], lab["gpus"][:1], now_plus(-1), now_plus(1), direct=True)
    book(lab["rita"], lab["gpus"][1:2], now_plus(3), now_plus(4), direct=True)  # upcoming
    book(lab["rita"], lab["gpus"][2:3], now_plus(-1), now_plus(-0.5), direct=True)  # over
    book(lab["rita"], lab["gpus"][3:4], now_plus(-1), now_plus(1), direct=True, pending=True)
    # Running, but the demo's example of an idle booking: no job.
    forgotten = book(lab["rita"], lab["gpus"][1:2], now_plus(-1), now_plus(1), direct=True)
    Reservation.objects.filter(pk=forgotten.pk).update(purpose=LEFT_IDLE_PURPOSE)
    real = node_with_gpus(1, name="gpu-real")
    AgentState.objects.create(node=real, last_seen=timezone.now(), backend="nvml")
    book(lab["rita"], list(real.gpus.all()), now_plus(-1), now_plus(1), direct=True)  # a real node's GPUs: never
    unknown = node_with_gpus(1, name="gpu-new")  # no agent has reported yet: not known to be simulated
    book(lab["rita"], list(unknown.gpus.all()), now_plus(-1), now_plus(1), direct=True)

    wanted = running_bookings(now=timezone.now(), device_root=device_root)
    assert [(item.reservation, item.username, item.paths) for item in wanted] == [
        (running.pk, unix_users[0].name, tuple(paths(device_root, 0)))
    ]
    assert wanted[0].end == running.end.timestamp()


@pytest.mark.parametrize("name", ["-rf", "a b", "../etc", "x\n", "Rita", "rita;id", "", "1abc"])
def test_a_name_that_is_no_unix_username_reaches_no_lookup_and_no_process(
    lab, runner, device_root, monkeypatch, name, caplog
):
    reservation = book(lab["rita"], lab["gpus"][:1], now_plus(-1), now_plus(1), direct=True)
    type(lab["rita"]).objects.filter(pk=lab["rita"].pk).update(unix_username=name)  # past the form's checks
    looked_up: list[str] = []
    runner.accounts = AccountCheck(uid_min=1000, lookup=lambda who: looked_up.append(who) or 0)
    monkeypatch.setattr(demo_jobs.pwd, "getpwnam", lambda who: looked_up.append(who) or pwd.getpwnam(who))
    monkeypatch.setattr(demo_jobs.subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))

    sync(runner, device_root)
    assert runner.jobs == {} and looked_up == []
    assert f"booking #{reservation.pk}: no job, {name!r} is not a unix username" in caplog.text


@pytest.mark.parametrize(
    ("name", "refusal"), [("root", "system account"), ("nobody", "'nobody'"), ("daemon", "system")]
)
def test_system_accounts_get_no_job(lab, runner, device_root, monkeypatch, name, refusal, caplog):
    book(lab["rita"], lab["gpus"][:1], now_plus(-1), now_plus(1), direct=True)
    type(lab["rita"]).objects.filter(pk=lab["rita"].pk).update(unix_username=name)
    monkeypatch.setattr(demo_jobs.subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    sync(runner, device_root)
    assert runner.jobs == {}
    assert refusal in caplog.text


def test_a_job_takes_turns_holding_and_closing_its_files(runner, device_root, unix_users):
    runner.busy, runner.idle = 1.0, 1.0
    path = paths(device_root, 0)[0]
    acl.grant(path, unix_users[0].name)
    runner.sync([Wanted(reservation=7, username=unix_users[0].name, end=time.time() + 600, paths=(path,))])
    pid = runner.jobs[7].process.pid

    assert wait_for(lambda: path in open_files(pid), timeout=15)
    assert wait_for(lambda: path not in open_files(pid), timeout=15)  # idle: the GPU reads 0 %
    assert wait_for(lambda: path in open_files(pid), timeout=15)
    assert runner.jobs[7].process.poll() is None


def test_a_job_ends_by_itself_at_the_end_of_its_booking(runner, device_root, unix_users):
    path = paths(device_root, 0)[0]
    acl.grant(path, unix_users[0].name)
    runner.sync([Wanted(reservation=8, username=unix_users[0].name, end=time.time() + 1, paths=(path,))])
    assert runner.jobs[8].process.wait(timeout=30) == 0


def test_a_job_whose_runner_is_gone_ends_within_seconds(device_root):
    """Started by a parent that exits at once (a runner killed with SIGKILL): the orphan must not hold on."""
    path = paths(device_root, 0)[0]
    # Passes its own pid, as the runner does, waits until the job holds its file, then exits.
    starter = """
import os, subprocess, sys, time
job = subprocess.Popen([*sys.argv[1:-1], str(os.getpid()), sys.argv[-1]], stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 90  # a loaded machine starts Python slowly: wait, do not fail
while time.monotonic() < deadline:
    fds = os.listdir(f"/proc/{job.pid}/fd")
    if any(os.readlink(f"/proc/{job.pid}/fd/{fd}") == sys.argv[-1] for fd in fds):
        print(job.pid, flush=True)
        break
    time.sleep(0.01)
"""
    job = [sys.executable, "-I", "-S", "-c", JOB, f"{time.time() + 600:.3f}", "3600", "0", "0"]
    started = subprocess.run([sys.executable, "-c", starter, *job, path], capture_output=True, text=True, timeout=120)
    pid = int(started.stdout)  # it held the file while its runner was there
    assert wait_for(lambda: gone(pid), timeout=30)


def test_without_root_or_a_python_for_everyone_it_says_why(monkeypatch, tmp_path):
    assert job_python() in ("/usr/bin/python3", "/usr/local/bin/python3")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "python3").symlink_to(Path("/usr/bin/python3").resolve())
    (tmp_path / "python3").write_text("")  # not executable
    assert job_python([str(closed / "python3"), str(tmp_path / "python3")]) is None

    monkeypatch.setattr(demo_jobs.os, "geteuid", lambda: 0)
    assert "no Python every user may run" in (skip_reason(None) or "")
    assert skip_reason("/usr/bin/python3") is None
    monkeypatch.setattr(demo_jobs.os, "geteuid", lambda: 1000)
    assert "needs root" in (skip_reason("/usr/bin/python3") or "")


def test_a_slice_bookings_job_holds_its_cards_file_and_the_slices_capability_files(lab, unix_users):
    """The demo's MIG card: the job of a slice booking opens what CUDA opens for a MIG device."""
    parent = tempfile.mkdtemp(prefix="gpbt-jobs-", dir="/tmp")
    try:
        root = os.path.join(parent, "gpubook-demo")
        device_dir = demo_device_dir(root, "gpu-a100")
        pieces = simulated_mig_cards_make(lab["node"], "0:3g.40gb,2g.20gb,2g.20gb")  # 2g.20gb at 0 and 2, 3g at 4
        layout = simulated_layout(lab["node"])  # what demo_agents writes into the agent's SIMULATED_MIG
        SimulatedBackend(device_dir=device_dir, node_name="gpu-a100", count=4, mig_layout=layout).close()
        booking = book(lab["rita"], pieces[:1], now_plus(-1), now_plus(1), direct=True)

        [wanted] = running_bookings(now=timezone.now(), device_root=root)
        minors = {
            line.split()[0]: int(line.split()[1]) for line in Path(device_dir, "mig-minors").read_text().splitlines()
        }
        gi = next(p for p in parse_simulated_mig(layout)[0] if p.placement_start == pieces[0].placement_start)
        caps = [f"gpu0/gi{gi.gpu_instance_id}/access", f"gpu0/gi{gi.gpu_instance_id}/ci0/access"]
        assert wanted.reservation == booking.pk
        assert wanted.paths == (
            os.path.join(device_dir, "nvidia0"),
            *(os.path.join(device_dir, "nvidia-caps", f"nvidia-cap{minors[name]}") for name in caps),
        )
        assert all(os.path.exists(path) for path in wanted.paths)
    finally:
        shutil.rmtree(parent)
