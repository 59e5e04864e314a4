"""Real unix users, real stand-in device files and real processes running as those users.

The agent's ACL and cleanup code is about what the kernel does, so its tests do not mock it:
a session fixture creates a few throwaway accounts (``gpbt_<random>``, ordinary uids) and
removes them at the end; the tests start processes as those accounts, and every process a test
starts is killed and reaped when the test ends. Tests that need this skip when not run as root.
"""

# Tests run fixed argument lists (never a shell) of tools and interpreters found on this machine.
# ruff: noqa: S603

from __future__ import annotations

import os
import pwd
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings

from tests.agent.harness import AgentRun, RecordingPortal

USERADD_TRIES = 5  # useradd fails while another process holds the /etc/passwd lock
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}

# A stand-in for a GPU job: opens the device for writing (and any further files for reading: a job on a MIG
# slice opens its two capability files too, as CUDA does), says so, then writes each line it is sent.
HOLDER = """
import signal, sys, time
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[3]:
    with open("/proc/self/comm", "w") as comm:
        comm.write(sys.argv[3])
device = open(sys.argv[1], "r+b", buffering=0)
capabilities = [open(path, "rb") for path in sys.argv[4:]]
print("ready", flush=True)
for line in sys.stdin:
    device.write(line.encode())
    print("wrote", flush=True)
time.sleep(60)
"""

# Tries to open the device for writing and prints what happened.
OPENER = """
import sys
try:
    open(sys.argv[1], "r+b").close()
except PermissionError:
    print("denied")
else:
    print("opened")
"""


# A set-user-ID root program (su waiting for a password, say) that the user handed the open device to: the user
# opens the device with their own rights, then the process runs with root's (real uid the user's, effective 0).
SETUID_HOLDER = """
import os, sys, time
uid, gid, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.setgroups([])
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, 0)
held = open(device, "r+b", buffering=0)
os.setresuid(uid, 0, 0)
with open("/proc/self/comm", "w") as comm:
    comm.write("su")
print("ready", flush=True)
time.sleep(600)
"""


@dataclass(frozen=True)
class UnixUser:
    name: str
    uid: int
    gid: int


def run_as(user: UnixUser) -> dict[str, Any]:
    """subprocess arguments that run a child as ``user`` and nothing more: without ``group`` and
    an empty ``extra_groups`` it would keep root's groups and open a 0660 root:root file through
    them, and every "denied" check would mean nothing."""
    return {"user": user.uid, "group": user.gid, "extra_groups": [], "cwd": "/", "env": CHILD_ENV}


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates users, sets ACLs and signals their processes")


@contextmanager
def throwaway_users(count: int) -> Iterator[list[UnixUser]]:
    """``count`` throwaway accounts with ordinary uids, deleted afterwards."""
    _need_root()
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if useradd is None or userdel is None:
        pytest.skip("useradd/userdel are not installed")
    created: list[str] = []
    try:
        for _ in range(count):
            name = f"gpbt_{secrets.token_hex(4)}"
            command = [useradd, "--no-create-home", "--shell", "/usr/sbin/nologin", "--no-user-group", name]
            for attempt in range(USERADD_TRIES):
                result = subprocess.run(command, capture_output=True, text=True, check=False)
                if result.returncode == 0 or attempt == USERADD_TRIES - 1:
                    break
                time.sleep(0.2)
            assert result.returncode == 0, result.stderr
            created.append(name)
        yield [UnixUser(name, pwd.getpwnam(name).pw_uid, pwd.getpwnam(name).pw_gid) for name in created]
    finally:
        for name in created:
            subprocess.run([userdel, name], capture_output=True, check=False)


@pytest.fixture(scope="session")
def unix_users() -> Iterator[list[UnixUser]]:
    """Three throwaway accounts with ordinary uids, deleted after the session."""
    with throwaway_users(3) as users:
        yield users


@pytest.fixture(scope="session")
def five_users(unix_users: list[UnixUser]) -> Iterator[list[UnixUser]]:
    """Five throwaway accounts: the three of ``unix_users`` and two more."""
    with throwaway_users(2) as more:
        yield [*unix_users, *more]


@pytest.fixture(scope="session")
def user_python(unix_users: list[UnixUser]) -> str:
    """An interpreter the test users may run (the venv's may live under root's 0700 home)."""
    candidates = [sys.executable, os.path.realpath(sys.executable), shutil.which("python3"), "/usr/bin/python3"]
    user = unix_users[0]
    for candidate in dict.fromkeys(c for c in candidates if c):
        try:
            result = subprocess.run(
                [candidate, "-I", "-c", "pass"],
                **run_as(user),
                capture_output=True,
                check=False,
            )
        except OSError:  # not executable by that user
            continue
        if result.returncode == 0:
            return candidate
    pytest.skip("no Python interpreter that an unprivileged user can run")


@pytest.fixture
def device() -> Iterator[str]:
    """A stand-in device file, 0660 root:root like a locked-down /dev/nvidiaN, in a dir anyone can traverse."""
    _need_root()
    directory = tempfile.mkdtemp(prefix="gpbt-", dir="/tmp")
    try:
        os.chmod(directory, 0o755)  # noqa: S103 - the test users must reach the file
        path = os.path.join(directory, "nvidia0")
        with open(path, "wb"):
            pass
        os.chown(path, 0, 0)
        os.chmod(path, 0o660)
        yield path
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def open_device(device: str) -> str:
    """The stand-in device at 0666, the NVIDIA driver's default: anyone may open it, no ACL needed."""
    os.chmod(device, 0o666)  # noqa: S103 - that is the point
    return device


Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn(user_python: str, started: list[subprocess.Popen[str]]) -> Spawn:
    """Start a holder process (``HOLDER``) as a user, or as root with ``user=None``; waits until it is ready.
    ``also``: files it opens besides the device (a MIG slice's capability files).

    Every process is killed and reaped at the end of the test, whatever happened (``started``).
    """

    def start(
        device: str,
        *,
        user: UnixUser | None,
        ignore_term: bool = False,
        name: str = "",
        also: Sequence[str] = (),
    ) -> subprocess.Popen[str]:
        return start_ready(
            [
                user_python if user else sys.executable,
                "-I",
                "-c",
                HOLDER,
                device,
                "ignore-term" if ignore_term else "-",
                name,
                *also,
            ],
            started,
            stdin=subprocess.PIPE,
            **(run_as(user) if user else {"cwd": "/", "env": CHILD_ENV}),
        )

    return start


def read_line(process: subprocess.Popen[str], timeout: float = 10.0) -> str:
    """The child's next output line, without hanging the suite if it never comes."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline().strip() if ready else ""


@pytest.fixture
def try_open(user_python: str) -> Callable[[str, UnixUser], str]:
    """Whether ``user`` can open ``path`` for writing right now: 'opened' or 'denied'."""

    def attempt(path: str, user: UnixUser) -> str:
        result = subprocess.run(
            [user_python, "-I", "-c", OPENER, path],
            **run_as(user),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    return attempt


@pytest.fixture
def portal() -> Iterator[RecordingPortal]:
    """A portal that records what agents send and answers OK (files needing another portal define theirs)."""
    recorder = RecordingPortal()
    yield recorder
    recorder.stop()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts, killed and reaped at its end whatever happened."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream:
                stream.close()


def start_ready(
    command: list[str], started: list[subprocess.Popen[str]], *, stdin: int = subprocess.DEVNULL, **options: Any
) -> subprocess.Popen[str]:
    """Start ``command`` (a holder that prints "ready" once it holds what it should), kept in ``started``."""
    process = subprocess.Popen(
        command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options
    )
    started.append(process)
    if read_line(process) != "ready":
        process.kill()
        _, errors = process.communicate(timeout=10)
        pytest.fail(f"the holder did not start: {errors.strip() or 'no answer'}")
    return process


@pytest.fixture
def make_agent(portal: RecordingPortal) -> Iterator[Callable[..., AgentRun]]:
    """Start agents on simulated nodes of their own (``AgentRun``'s options), reporting to ``portal``; each is killed
    and its files removed at the end. ``entry``: what the interpreter runs instead of the agent's module."""
    runs: list[AgentRun] = []

    def make(*, entry: tuple[str, ...] = ("-m", "gpubook_agent.main"), **options: Any) -> AgentRun:
        options.setdefault("broker_url", settings.CELERY_BROKER_URL)
        options.setdefault("portal_url", portal.url)
        run = AgentRun(**options)
        runs.append(run)
        run.start(entry=entry)
        return run

    yield make
    for run in runs:
        run.cleanup()
