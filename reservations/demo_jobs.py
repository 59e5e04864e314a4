"""Demo jobs: a harmless job on the stand-in GPUs of every running demo booking, run as its owner.

On a simulated node a "job" is a process that holds a GPU's stand-in device file open (the simulated
backend counts those holders, gpubook_agent/gpus/simulated.py). For the demo to look like a lab at work,
``manage.py demo_jobs`` (started by scripts/run) runs one per running booking of a simulated node, as the
booking's own unix user, as a researcher would: the job opens the files itself, so the ACLs the agent
granted are what let it in. It works in phases (busy: the files held open; idle: closed), so reports show
both used and idle time, and it ends by itself at the booking's end, when its parent (the runner) is gone,
or at its next busy phase once access has been taken back. The runner stops the jobs of bookings that no
longer run (cancelled, released, ended) and starts them again when a booking's end or GPUs change.

The job is a fixed program for the system's Python (``JOB``), never the checkout's virtualenv, which the
demo users may not be able to reach; its arguments are numbers and paths the runner built, and the
username it runs as is checked (syntax, then the node's own rules: no system account) before any lookup
or process. Running a process as another user needs root: without it the command says so and waits.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from gpubook_agent import procfs
from gpubook_agent.accounts import AccountCheck
from gpubook_agent.gpus import mig
from gpubook_agent.gpus.simulated import closed_to_others, demo_device_dir, parse_simulated_mig
from gpubook_agent.usernames import valid_username
from nodes.mig import simulated_layout
from nodes.models import Gpu
from reservations.models import Allocation, Reservation

log = logging.getLogger(__name__)

PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")  # Debian's, and the python image's
JOB_COMM = "gpubook-demojob"  # its name in ps and /proc/<pid>/comm (at most 15 characters)
EXIT_NO_ACCESS = 3  # the job's exit status when a file would not open: no grant (yet), or taken back
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
STOP_SECONDS = 5.0

# argv: end (epoch seconds), busy seconds, idle seconds, phase offset, the runner's pid, then the device
# files. Busy: every file open (as CUDA opens /dev/nvidiaN); idle: all closed. Sleeps in steps of at most
# 5 s so that it notices its end, and that its runner is gone (it is then an orphan, whose parent is
# another process: the runner's pid is passed, since it may be gone before the job reads its own parent).
JOB = r"""
import os, sys, time
end, busy, idle, offset = (float(value) for value in sys.argv[1:5])
parent, paths, period, held = int(sys.argv[5]), sys.argv[6:], busy + idle, []
try:
    with open("/proc/self/comm", "w") as comm:
        comm.write("JOB_COMM")
except OSError:
    pass
while True:
    now = time.time()
    if now >= end or os.getppid() != parent:
        sys.exit(0)
    into = (now + offset) % period
    if into < busy and not held:
        try:
            for path in paths:
                held.append(os.open(path, os.O_RDWR | os.O_NOFOLLOW))
        except OSError:
            sys.exit(EXIT_NO_ACCESS)
    elif into >= busy and held:
        for fd in held:
            os.close(fd)
        held = []
    change = busy - into if into < busy else period - into
    time.sleep(max(0.05, min(5.0, change, end - now)))
""".replace("JOB_COMM", JOB_COMM).replace("EXIT_NO_ACCESS", str(EXIT_NO_ACCESS))


@dataclass(frozen=True)
class Wanted:
    """A running booking's job: who runs it, until when, on which stand-in device files."""

    reservation: int
    username: str | None  # None for a user with no unix username yet: no job runs (_account says why)
    end: float  # epoch seconds
    paths: tuple[str, ...]


@dataclass
class Job:
    wanted: Wanted
    process: subprocess.Popen[bytes]


# A booking with this purpose gets no job: the demo's forgotten booking, so the idle alert has something to say.
LEFT_IDLE_PURPOSE = "booked, then forgotten (no job runs: the idle alert's example)"


def running_bookings(*, now: datetime, device_root: str) -> list[Wanted]:
    """Approved bookings of active people running at ``now`` on nodes whose agent runs the simulated
    backend (never a real node's GPUs), with their GPUs' stand-in files under ``device_root``."""
    rows = (
        Allocation.objects.filter(
            active=True,
            reservation__status=Reservation.Status.APPROVED,
            reservation__user__is_active=True,
            start__lte=now,
            end__gt=now,
            gpu__node__agent_state__backend="simulated",
        )
        .exclude(reservation__purpose=LEFT_IDLE_PURPOSE)
        .select_related("reservation__user", "gpu__node", "gpu__parent")
        .order_by("reservation_id", "gpu__index")
    )
    found: dict[int, Wanted] = {}
    for allocation in rows:
        gpu = allocation.gpu
        card = gpu.parent or gpu  # a slice lives on its card's file, and its own capability files
        device_dir = demo_device_dir(device_root, gpu.node.name)
        paths = (os.path.join(device_dir, f"nvidia{card.index}"), *_slice_capability_files(device_dir, gpu))
        earlier = found.get(allocation.reservation_id)
        found[allocation.reservation_id] = Wanted(
            reservation=allocation.reservation_id,
            username=allocation.reservation.user.unix_username,
            end=max(allocation.end.timestamp(), earlier.end if earlier else 0.0),
            paths=tuple(dict.fromkeys((*(earlier.paths if earlier else ()), *paths))),
        )
    return list(found.values())


def _slice_capability_files(device_dir: str, gpu: Gpu) -> tuple[str, ...]:
    """A MIG slice's stand-in capability files, numbered as the simulated agent numbers them in its
    mig-minors (none for a card, and none before the agent has written them: the card's file alone)."""
    if gpu.parent is None:
        return ()
    try:
        minors = mig.read_mig_minors(os.path.join(device_dir, "mig-minors"))
        plan = parse_simulated_mig(simulated_layout(gpu.node)).get(gpu.parent.index, ())
    except (OSError, ValueError):  # not written yet, or a layout the demo did not make
        return ()
    piece = next((planned for planned in plan if planned.placement_start == gpu.placement_start), None)
    if piece is None:
        return ()
    return mig.slice_capability_files(
        minors,
        os.path.join(device_dir, "nvidia-caps"),
        card_minor=gpu.parent.index,  # a simulated card's minor is its index
        gpu_instance_id=piece.gpu_instance_id,
        compute_instance_id=0,
    )


def job_python(candidates: Iterable[str] = PYTHONS) -> str | None:
    """The first system Python that any user may run (every folder above it open to others)."""
    for candidate in candidates:
        # The link's folders as well as the file's: a user reaches the file through both.
        if open_to_others(candidate) and open_to_others(os.path.realpath(candidate), execute=True):
            return candidate
    return None


def open_to_others(path: str, *, execute: bool = False) -> bool:
    """Whether the mode bits let any user reach ``path`` (and run it, with ``execute``)."""
    try:
        if execute and not (os.path.isfile(path) and os.stat(path).st_mode & stat.S_IXOTH):
            return False
    except OSError:
        return False
    return closed_to_others(os.path.dirname(path)) is None


def skip_reason(python: str | None) -> str | None:
    """Why this process cannot run demo jobs at all, or None when it can."""
    if os.geteuid() != 0:
        return (
            "demo jobs skipped: running a job as each booking's own user needs root (run scripts/run as root); "
            "the demo GPUs stay idle until something holds their files open"
        )
    if python is None:
        return f"demo jobs skipped: no Python every user may run ({' or '.join(PYTHONS)})"
    return None


def phases(reservation: int, *, busy: float, idle: float) -> tuple[float, float, float]:
    """Busy and idle seconds and a phase offset, fixed per booking so that bookings do not all pause at once."""
    period = busy + idle
    return busy, idle, (reservation * 97.0) % period


class DemoJobs:
    """Keeps one job per wanted booking: ``sync`` starts what is missing and stops what is no longer wanted."""

    def __init__(
        self,
        *,
        python: str,
        busy_seconds: float = 180.0,
        idle_seconds: float = 60.0,
        retry_seconds: float = 15.0,
        accounts: AccountCheck | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if busy_seconds <= 0 or idle_seconds < 0:
            raise ValueError("a demo job needs busy seconds above 0 and idle seconds of at least 0")
        self.python = python
        self.busy, self.idle, self.retry = busy_seconds, idle_seconds, retry_seconds
        self.accounts = accounts or AccountCheck(uid_min=procfs.uid_min())
        self.clock = clock
        self.jobs: dict[int, Job] = {}
        self._not_before: dict[int, float] = {}  # no new start before then (a job just failed or ended)
        self._said: set[tuple[int, str]] = set()

    def sync(self, wanted: Iterable[Wanted]) -> None:
        wanted_by_id = {item.reservation: item for item in wanted}
        for reservation, job in list(self.jobs.items()):
            if wanted_by_id.get(reservation) != job.wanted:
                self._stop(reservation, "the booking no longer runs as it did")
        self._reap()
        for reservation in set(self._not_before) - set(wanted_by_id):
            del self._not_before[reservation]
        now = self.clock()
        for reservation, item in wanted_by_id.items():
            if reservation in self.jobs or self._not_before.get(reservation, 0.0) > now:
                continue
            account = self._account(item)
            if account is None:
                self._not_before[reservation] = now + self.retry
                continue
            self._start(item, *account)

    def stop_all(self) -> None:
        for reservation in list(self.jobs):
            self._stop(reservation, "the demo stops")

    def _account(self, item: Wanted) -> tuple[int, int] | None:
        """The uid and gid to run the job as; None (said once) for a name no job may run as."""
        name = item.username
        if not valid_username(name):  # before any lookup: the name came from the database
            self._once(item.reservation, f"booking #{item.reservation}: no job, {name!r} is not a unix username")
            return None
        refusal = self.accounts.refusal(name)
        if refusal is not None:
            self._once(item.reservation, f"booking #{item.reservation}: no job, {refusal}")
            return None
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            self._once(item.reservation, f"booking #{item.reservation}: no job, there is no account {name!r} here")
            return None
        if entry.pw_uid == 0 or entry.pw_gid == 0:  # never root's, whatever UID_MIN says
            self._once(item.reservation, f"booking #{item.reservation}: no job, {name!r} is uid or gid 0")
            return None
        return entry.pw_uid, entry.pw_gid

    def _start(self, item: Wanted, uid: int, gid: int) -> None:
        busy, idle, offset = phases(item.reservation, busy=self.busy, idle=self.idle)
        argv = [self.python, "-I", "-S", "-c", JOB, f"{item.end:.3f}", f"{busy:g}", f"{idle:g}", f"{offset:g}"]
        argv.append(str(os.getpid()))  # the job's parent: it ends when that is no longer so
        try:
            process = subprocess.Popen(  # noqa: S603 - a fixed program; its arguments are numbers and our paths
                [*argv, *item.paths],
                user=uid,
                group=gid,
                extra_groups=[],  # only the user's own group: never the runner's (root's) groups
                cwd="/",
                env=CHILD_ENV,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C meant for the runner reaches it, and it stops the jobs
            )
        except OSError as error:
            self._once(item.reservation, f"booking #{item.reservation}: cannot start its job: {error}")
            self._not_before[item.reservation] = self.clock() + self.retry
            return
        self.jobs[item.reservation] = Job(item, process)
        log.info(
            "booking #%s: job %s started as %s on %s (until %s)",
            item.reservation,
            process.pid,
            item.username,
            ", ".join(item.paths),
            time.strftime("%H:%M:%S", time.localtime(item.end)),
        )

    def _reap(self) -> None:
        for reservation, job in list(self.jobs.items()):
            code = job.process.poll()
            if code is None:
                continue
            del self.jobs[reservation]
            # Whatever the reason, not again at once: a job that cannot open its files must not spin.
            self._not_before[reservation] = self.clock() + self.retry
            if code == EXIT_NO_ACCESS:
                self._once(
                    reservation,
                    f"booking #{reservation}: its job could not open {', '.join(job.wanted.paths)} "
                    f"(no grant yet?); trying again every {self.retry:g} s",
                )
            elif code != 0:
                log.warning("booking #%s: job %s exited with status %s", reservation, job.process.pid, code)

    def _stop(self, reservation: int, why: str) -> None:
        job = self.jobs.pop(reservation)
        process = job.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.info("booking #%s: job %s stopped (%s)", reservation, process.pid, why)

    def _once(self, reservation: int, message: str) -> None:
        if (reservation, message) not in self._said:
            self._said.add((reservation, message))
            log.warning("%s", message)
