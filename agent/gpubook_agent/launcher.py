"""Running a booking's environment on the node as the booking's user, bounded by the slot (issue 22).

Each launch runs as the agent's own child (the supervisor) or, where systemd is PID 1, in a transient systemd unit
(``units``, ``unit_argv``), with one contract: the command runs as the user (never root: root, and every account a
lease would be refused for: under UID_MIN, nobody, PROTECTED_USERS; the name must follow the portal's username
syntax), from an argument list, never a shell, with a clean environment (a fixed PATH, HOME, USER, LOGNAME, LANG,
the launch's MARKER and what the caller adds), its limits set before it starts, and its output, through a pipe to
the agent, in a log only root can open, which the agent keeps under LOG_MAX_BYTES.

As a child, it runs in a session and process group of its own, with the limits the kernel offers per process
(util-linux's ``prlimit``: address space, processes, open files); ``stop`` ends it and everything it started (its
session, and while the command runs every descendant, even one that left the session with ``setsid``; after it
has exited, what is left of its session): SIGTERM, the grace, then SIGKILL, through pidfds (cleanup.terminate), so
a recycled pid is never hit. A process that left both the session and the family escapes that: a unit's cgroup
does not let it (``systemctl stop`` ends the whole cgroup), and its limits are the cgroup's. Either way the
enforcer's revocation and its end of whatever still holds a GPU stay the authority.

launches.py decides what runs when (a lease's launches, from its signed snapshot); this module only runs and ends
them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pwd
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from gpubook_agent import cleanup, procfs
from gpubook_agent.accounts import AccountCheck
from gpubook_agent.protocol import MAX_ARG_CHARS, argv_problem
from gpubook_agent.usernames import valid_username

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"\Agpubook-[a-z0-9-]{1,56}\Z")
ENV_NAME_RE = re.compile(r"\A[A-Z_][A-Z0-9_]{0,63}\Z")
PATH = "/usr/local/bin:/usr/bin:/bin"
TAIL_BYTES = 4000
# A launch's output goes through a pipe to the agent, which keeps its log under this size (the last half of it when
# it grows past): a chatty or hostile command cannot fill the node's disk, and its own files have no limit.
LOG_MAX_BYTES = 4 * 1024 * 1024
# Every launch's processes carry this variable (its name): an agent that restarted finds what an earlier run of it
# started (launches.py ends those before it starts anything).
MARKER = "GPUBOOK_LAUNCH"


class LaunchRefused(Exception):
    """The launch is not started: the message says why, in words for the portal's event."""


@dataclass(frozen=True)
class LaunchSpec:
    name: str  # gpubook-<lease>-<n>: the log's name, and the unit's on systemd nodes
    user: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    memory_max_bytes: int | None = None  # address space of each process (RLIMIT_AS); a unit's MemoryMax
    max_processes: int | None = None  # the user's processes (RLIMIT_NPROC); a unit's TasksMax
    open_files: int | None = None  # RLIMIT_NOFILE
    runtime_max_seconds: int | None = None  # a unit's RuntimeMaxSec: systemd ends it then, whatever the agent does
    grace_seconds: float = 30.0  # a unit's TimeoutStopSec: SIGTERM, this long, then SIGKILL for its whole cgroup
    delegate: bool = False  # a unit's Delegate=yes: rootless podman makes cgroups of its own inside it


@dataclass
class Launch:
    spec: LaunchSpec
    process: subprocess.Popen[bytes]
    log_path: str
    exit_code: int | None = None  # once its command has exited (negative: the signal that ended it)
    stopped: bool = False  # ended by ``stop``, not by itself
    unkillable: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid


class Supervisor:
    """The launches of one node. Thread-safe: the enforcer's thread starts and stops them, the reporter polls."""

    def __init__(
        self,
        *,
        log_dir: str,
        accounts: AccountCheck | None = None,
        uid_min: int | None = None,
        units: bool = False,
    ) -> None:
        """``accounts``: the enforcer's own check (its protected users too); else one with ``uid_min`` (or the
        node's UID_MIN). ``units``: run each launch in a transient systemd unit (``unit_argv``), on nodes where
        systemd is PID 1."""
        self.log_dir = log_dir
        self.units = units
        self.accounts = accounts or AccountCheck(uid_min=procfs.uid_min() if uid_min is None else uid_min)
        self._launches: dict[str, Launch] = {}
        self._lock = threading.Lock()

    def start(self, spec: LaunchSpec) -> Launch:
        """Start ``spec``'s command as its user; LaunchRefused, with nothing started, when it may not run."""
        _check(spec)
        account = self.account(spec.user)
        with self._lock:
            running = self._launches.get(spec.name)
            if running is not None and running.process.poll() is None:
                raise LaunchRefused(f"{spec.name} runs already (pid {running.pid})")
            log_path = os.path.join(self.log_dir, f"{spec.name}.log")
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            log_fd = os.open(log_path, flags, 0o600)  # root's alone; the agent writes what the command prints
            try:
                process = self._unit(spec, account) if self.units else self._child(spec, account)
            except (OSError, LaunchRefused) as error:
                os.close(log_fd)
                for path in (log_path, log_path.removesuffix(".log") + ".env"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                if isinstance(error, LaunchRefused):
                    raise
                raise LaunchRefused(f"{spec.argv[0]} could not be started: {error.strerror}") from None
            launch = Launch(spec=spec, process=process, log_path=log_path)
            assert process.stdout is not None
            threading.Thread(
                target=_pump, args=(process.stdout, log_fd), name=f"agent-log-{spec.name}", daemon=True
            ).start()
            self._launches[spec.name] = launch
            return launch

    def _child(self, spec: LaunchSpec, account: pwd.struct_passwd) -> subprocess.Popen[bytes]:
        """The command as the agent's own child: as the user, in a session of its own, prlimit's limits first."""
        return subprocess.Popen(  # noqa: S603 - an argument list, checked by start(); never a shell
            [*_limits(spec), *spec.argv],
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=os.getgrouplist(account.pw_name, account.pw_gid),
            start_new_session=True,
            cwd=_home(account),
            env={**_environment(account, spec.env), MARKER: spec.name},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            close_fds=True,
        )

    def _unit(self, spec: LaunchSpec, account: pwd.struct_passwd) -> subprocess.Popen[bytes]:
        """The command in a transient systemd unit: systemd-run (as root) asks PID 1 to start it as the user, in a
        cgroup of its own outside the agent's, and waits for it, its output on our pipe. The environment goes in
        a root-only file systemd reads (a unit's Environment= is anyone's to read with systemctl show)."""
        systemd_run = _systemd_run()
        env_path = os.path.join(self.log_dir, f"{spec.name}.env")
        env_fd = os.open(env_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(env_fd, "w") as env_file:
            for key, value in {**_environment(account, spec.env), MARKER: spec.name}.items():
                env_file.write(f"{key}={_quoted(value)}\n")
        return subprocess.Popen(  # noqa: S603 - an argument list, checked by start(); never a shell
            unit_argv(spec, account, systemd_run=systemd_run, env_file=env_path),
            start_new_session=True,
            env={"PATH": PATH, "LANG": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            close_fds=True,
        )

    def run_as(
        self, account: pwd.struct_passwd, argv: list[str], *, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """A short command as ``account`` (podman's image checks, pulls and stops), where its launches run: with
        units, in a transient unit of its own (outside the agent's sandbox, whose NoNewPrivileges and read-only
        homes rootless podman cannot work under), else as the agent's child. Its output, as text."""
        environment = _environment(account, {})
        if self.units:
            setenv = [f"--setenv={key}={value}" for key, value in environment.items()]  # no secrets among them
            argv = [*_as_unit(_systemd_run(), account), *setenv, "--", *argv]
            user: dict[str, Any] = {"env": {"PATH": PATH, "LANG": "C.UTF-8"}}
        else:
            user = {
                "user": account.pw_uid,
                "group": account.pw_gid,
                "extra_groups": os.getgrouplist(account.pw_name, account.pw_gid),
                "cwd": _home(account),
                "env": environment,
            }
        return subprocess.run(  # noqa: S603 - an argument list; the account is one account() accepted
            argv, **user, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False
        )

    def poll(self) -> list[Launch]:
        """The launches whose command has exited since the last poll (each once)."""
        exited = []
        with self._lock:
            for launch in self._launches.values():
                if launch.exit_code is None and (code := launch.process.poll()) is not None:
                    launch.exit_code = code
                    exited.append(launch)
        return exited

    def stop(self, name: str, *, grace: float) -> Launch | None:
        """End the launch and everything it started: SIGTERM, ``grace`` seconds, then SIGKILL. None: no such one."""
        with self._lock:
            launch = self._launches.get(name)
        if launch is None:
            return None
        # Until the agent reaps its command (poll), the pid stays the command's, a zombie at worst; once reaped,
        # the number may be another process's, and so may its children's parent: then only the session counts
        # (Linux reuses no pid that is still a session's id).
        running = launch.process.poll() is None
        if self.units and running:
            stop_unit(name, grace)  # the whole cgroup: SIGTERM, TimeoutStopSec, SIGKILL; systemd-run then returns
        result = cleanup.terminate(family(launch.pid, reaped=not running), term_timeout=grace)
        launch.unkillable = result.unkillable
        launch.stopped = launch.stopped or running
        with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable: the exit code comes with a later poll
            launch.exit_code = launch.process.wait(timeout=1)
        return launch

    def exit_code(self, name: str) -> int | None:
        """The launch's command's exit code once it has exited (and been reaped by poll, stop or this), else None."""
        with self._lock:
            launch = self._launches.get(name)
        if launch is None:
            return None
        if launch.exit_code is None:
            launch.exit_code = launch.process.poll()
        return launch.exit_code

    def processes(self, name: str) -> list[int]:
        """The launch's processes now: its command's family while it runs (launches.py adds a container's monitor)
        and, with units, every process in its unit's cgroup (the command is PID 1's child there, not ours)."""
        with self._lock:
            launch = self._launches.get(name)
        if launch is None:
            return []
        members = set(family(launch.pid)) if launch.process.poll() is None else set()
        if self.units:
            members |= set(procfs.cgroup_members(f"{name}.service"))
        return sorted(members)

    def clear_old_files(self) -> int:
        """At the agent's start, before any launch: the logs and environment files an earlier run left (it knew
        their launches; this run does not). Returns how many went."""
        removed = 0
        with self._lock:
            known = set(self._launches)
        for entry in os.scandir(self.log_dir):
            name, _, suffix = entry.name.rpartition(".")
            if suffix in ("log", "env") and name not in known and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
        return removed

    def forget(self, name: str) -> None:
        """Drop an ended launch and its log (launches.py, an hour after it ended)."""
        with self._lock:
            launch = self._launches.get(name)
            if launch is None or launch.process.poll() is None:
                return
            del self._launches[name]
        for path in (launch.log_path, launch.log_path.removesuffix(".log") + ".env"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def tail(self, name: str, limit: int = TAIL_BYTES) -> str:
        """The end of the launch's output, as text (undecodable bytes replaced)."""
        with self._lock:
            launch = self._launches.get(name)
        if launch is None:
            return ""
        with open(launch.log_path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - limit))
            return log.read().decode("utf-8", "replace")

    def account(self, user: str) -> pwd.struct_passwd:
        """The account a launch runs as: one this node would give a GPU to (accounts.AccountCheck, the rule its
        leases follow), asked afresh; and never root, whatever UID_MIN says. LaunchRefused otherwise."""
        if not valid_username(user):
            raise LaunchRefused(f"bad username {user!r}")
        refusal = self.accounts.refusal(user, max_age=0)
        if refusal is None:
            account = pwd.getpwnam(user)
            if account.pw_uid != 0:
                return account
            refusal = f"{user!r} is root"
        raise LaunchRefused(f"not an ordinary account here: {refusal}")


def _check(spec: LaunchSpec) -> None:
    if not NAME_RE.match(spec.name):
        raise LaunchRefused(f"bad launch name {spec.name!r}")
    if not valid_username(spec.user):
        raise LaunchRefused(f"bad username {spec.user!r}")
    problem = argv_problem(spec.argv)
    if problem:
        raise LaunchRefused(problem)
    for key, value in spec.env.items():
        if not ENV_NAME_RE.match(key) or "\0" in value or "\n" in value or len(value) > MAX_ARG_CHARS:
            raise LaunchRefused(f"bad environment variable {key!r}")
    for limit in (spec.memory_max_bytes, spec.max_processes, spec.open_files):
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise LaunchRefused("limits are positive whole numbers")


def unit_argv(spec: LaunchSpec, account: pwd.struct_passwd, *, systemd_run: str, env_file: str) -> list[str]:
    """systemd-run's command line for a launch (systemd-run(1), systemd.exec(5), systemd.resource-control(5)): a
    transient service named as the launch, as the user, collected once it ends, with stdio on systemd-run's (which
    waits for it and passes its exit status on), its limits as cgroup limits, and systemd's own timer as a backstop
    (RuntimeMaxSec, from launches.py: past the slot's end; the agent stops the unit at the slot's end itself)."""
    properties = [
        f"EnvironmentFile={env_file}",
        f"TimeoutStopSec={max(1, math.ceil(spec.grace_seconds))}",
        "KillMode=control-group",
        "SendSIGKILL=yes",
    ]
    if spec.runtime_max_seconds:
        properties.append(f"RuntimeMaxSec={spec.runtime_max_seconds}")
    if spec.memory_max_bytes:
        properties.append(f"MemoryMax={spec.memory_max_bytes}")
    if spec.max_processes:
        properties.append(f"TasksMax={spec.max_processes}")
    if spec.open_files:
        properties.append(f"LimitNOFILE={spec.open_files}")
    if spec.delegate:
        properties.append("Delegate=yes")
    return [
        *_as_unit(systemd_run, account, name=spec.name),
        *(f"--property={item}" for item in properties),
        "--",
        *spec.argv,
    ]


def _as_unit(systemd_run: str, account: pwd.struct_passwd, *, name: str | None = None) -> list[str]:
    """systemd-run's options for a transient service as ``account``, waited for, its stdio on systemd-run's, gone
    once it ends (named ``name``, else as systemd picks)."""
    return [
        systemd_run,
        *([f"--unit={name}"] if name else []),
        f"--uid={account.pw_uid}",
        f"--gid={account.pw_gid}",
        f"--working-directory={_home(account)}",
        "--service-type=exec",
        "--collect",
        "--quiet",
        "--pipe",
    ]


def _systemd_run() -> str:
    found = shutil.which("systemd-run")
    if found is None:
        raise LaunchRefused("this node has no systemd-run, which LAUNCH_RUNNER=systemd asks for")
    return found


def _home(account: pwd.struct_passwd) -> str:
    """Where the user's commands start: their home, or / when it does not exist on this node."""
    return account.pw_dir if os.path.isdir(account.pw_dir) else "/"


def uses_units(runner: str, *, systemd_run: str | None, pid1: str = "/proc/1/comm") -> bool:
    """Whether LAUNCH_RUNNER ``runner`` runs launches in transient systemd units: ``systemd``, or ``auto`` where
    systemd is PID 1 and systemd-run (its path here, or None) is installed."""
    if runner == "auto":
        return systemd_run is not None and systemd_is_init(pid1)
    return runner == "systemd"


def systemd_is_init(pid1: str = "/proc/1/comm") -> bool:
    """Whether systemd is PID 1 here (then LAUNCH_RUNNER=auto runs launches in transient units)."""
    try:
        with open(pid1) as comm:
            return comm.read().strip() == "systemd"
    except OSError:
        return False


def stop_unit(name: str, grace: float) -> None:
    """``systemctl stop`` the launch's unit: SIGTERM to its whole cgroup, its TimeoutStopSec, SIGKILL."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return
    try:
        subprocess.run(  # noqa: S603 - fixed arguments and a checked name
            [systemctl, "stop", f"{name}.service"], capture_output=True, timeout=grace + 15, check=False
        )
    except subprocess.TimeoutExpired:
        log.warning("systemctl stop %s took longer than its grace: its processes are ended directly", name)


def _quoted(value: str) -> str:
    """A value for an EnvironmentFile= line: double quotes, with backslashes, quotes and newlines escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _limits(spec: LaunchSpec) -> list[str]:
    """The ``prlimit`` prefix that sets the limits before the command runs (none without limits)."""
    options = [
        f"--{option}={value}"
        for option, value in (("as", spec.memory_max_bytes), ("nproc", spec.max_processes), ("nofile", spec.open_files))
        if value is not None
    ]
    if not options:
        return []
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise LaunchRefused("this node has no prlimit (util-linux): the launch's limits cannot be set")
    return [prlimit, *options, "--"]


def _environment(account: pwd.struct_passwd, extra: Mapping[str, str]) -> dict[str, str]:
    return {
        "PATH": PATH,
        "HOME": account.pw_dir,
        "USER": account.pw_name,
        "LOGNAME": account.pw_name,
        "LANG": "C.UTF-8",
        **extra,
    }


def _pump(output: IO[bytes], log_fd: int) -> None:
    """Copy a launch's output into its log until the command and all it started have closed it; past LOG_MAX_BYTES,
    keep the last half. Runs on a thread of its own per launch."""
    size, limit = 0, LOG_MAX_BYTES
    try:
        while chunk := os.read(output.fileno(), 65536):
            if size + len(chunk) > limit:
                # Half the cap stays: the newest output, this chunk's tail included (a chunk may be as large as
                # the whole cap when the command writes faster than this thread reads).
                chunk = chunk[-(limit // 2) :]
                keep = min(size, limit // 2 - len(chunk))
                os.lseek(log_fd, size - keep, os.SEEK_SET)
                kept = os.read(log_fd, keep) if keep else b""
                os.ftruncate(log_fd, 0)
                os.lseek(log_fd, 0, os.SEEK_SET)
                size = os.write(log_fd, kept)
            size += os.write(log_fd, chunk)
    except OSError as error:
        log.warning("a launch's log stopped: %s", error)
    finally:
        output.close()
        os.close(log_fd)


# -- a launch's processes ---------------------------------------------------------------------------------


def family(root: int, *, reaped: bool = False, proc: str = procfs.PROC) -> list[int]:
    """``root`` and every process in its session or descended from it (a child that called ``setsid`` left
    the session, not the family), read from /proc. ``reaped``: root has exited and been reaped, so its pid
    may name another process now: only the members of its session (they keep the number reserved)."""
    parents: dict[int, int] = {}
    members = set() if reaped else {root}
    for pid, ppid, session in procfs.process_tree(proc=proc):
        parents[pid] = ppid
        if session == root:
            members.add(pid)
    if reaped:
        return sorted(members)
    for pid in parents:
        ancestor, seen = parents.get(pid), 0
        while ancestor and seen < 64:
            if ancestor == root:
                members.add(pid)
                break
            ancestor, seen = parents.get(ancestor), seen + 1
    return sorted(members)
