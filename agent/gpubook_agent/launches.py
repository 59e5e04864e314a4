"""Running the environments that leases ask for (issue 22), bounded by their slots.

A lease may name launches (protocol.LaunchRequest): a container image or a plain command the admins listed, to run
as the lease's user while the lease lasts. Level-triggered, like the leases themselves: every pass (a second
apart, and right after each enforcement pass) compares what the stored snapshot asks for *now* with what runs.

- A launch starts once its lease is active and every device file of its GPUs is open to the user (so a container
  can open what it is given), never as root: launcher.Supervisor runs it as the user, in a transient systemd unit
  where systemd is PID 1 or else in a session of its own, with its limits, from an argument list. A container is
  rootless podman with only the lease's device files (``--device``), a read-only image, no capabilities, no new
  privileges, a per-user volume for /work, and no network unless its command serves a port, which is then
  published on the node's loopback only.
- Where it serves (issue 36; endpoints.py): ``{socket}`` is a Unix socket in a directory of the user's alone, made
  for the launch and removed when it ends (a container gets that directory, at the same path, and no network);
  ``{port}``, for commands that serve only TCP, is a loopback port any account could race for, so its port and
  token are reported only once the launch's own processes hold its listener, and another account's listener
  there refuses the launch (and stops it). A launch that serves neither gets its token at once.
- It ends when the lease ends (the slot's end, a release, a cancellation: the lease leaves the snapshot) or the
  portal stops listing it (someone pressed Stop): SIGTERM, the node's grace, SIGKILL, for the command and all it
  started; a container is stopped through podman first, since its processes are not the command's children.
  The enforcer's own cleanup at the slot's end (revoked ACLs, leftover holders ended) stays the authority; this
  is the orderly first line.
- A launch that exited on its own is not started again; nor is one refused (a kind this node does not run, an
  account it refuses, a bad request). Every change is an event for the portal, and each heartbeat carries every
  launch's state, its output's tail and, for a notebook, its socket or port and its token once it serves there
  (``statuses``).

The agent remembers what it started only while it runs: a restarted agent first ends what its earlier run left
(``end_leftovers``), then starts again the launches of leases still active (a clean stop ends them, as it closes
the GPUs).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from gpubook_agent import cleanup, endpoints, procfs, protocol
from gpubook_agent.config import AgentConfig
from gpubook_agent.launcher import MARKER, LaunchRefused, LaunchSpec, Supervisor, family, stop_unit
from gpubook_agent.snapshot import LaunchOrder, Lease

log = logging.getLogger(__name__)

STARTING, RUNNING, EXITED, STOPPED, REFUSED = "starting", "running", "exited", "stopped", "refused"
KEEP_ENDED_SECONDS = 3600.0  # how long an ended launch stays in heartbeats (the portal has it long before)
PASS_SECONDS = 1.0
PULL_AHEAD = timedelta(hours=1)  # a container's image is pulled (as its user) this long before its slot starts
RUNTIME_BACKSTOP = timedelta(days=1)  # a unit's RuntimeMaxSec runs this long past its slot's end as known
PODMAN_TIMEOUT = 600.0  # a pull or an image check that takes longer is given up
SHARED_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")  # open to everyone anyway
CONTAINER_WORKDIR = "/work"
CONTAINER_VOLUME = "gpubook-work"  # a named volume in the user's own (rootless) storage: theirs alone
LEFTOVER_NAME_RE = re.compile(r"\Agpubook-(?P<reservation>[0-9]{1,18})-(?P<number>[0-9]{1,7})\Z")


class LeaseSource(Protocol):
    """What launches need from the enforcer (enforcer.Enforcer)."""

    def active_leases(self, now: datetime) -> list[tuple[Lease, tuple[str, ...] | None]]: ...

    def refused_leases(self, now: datetime) -> list[tuple[Lease, str]]: ...

    def upcoming_leases(self, now: datetime, within: timedelta) -> list[Lease]: ...

    def lease_of(self, reservation: int) -> Lease | None: ...


@dataclass
class Entry:
    """One launch this agent knows: asked for, started, or ended lately."""

    reservation: int
    number: int
    user: str
    order: LaunchOrder
    end: datetime  # the lease's when it started: a unit's RuntimeMaxSec is counted from it
    state: str = STARTING
    message: str = ""
    exit_code: int | None = None
    port: int | None = None
    token: str = ""
    uid: int = -1  # its user's, as the start looked them up (-1 before): whose sockets and processes are its own
    socket: str = ""  # its Unix socket's path ({socket}), in a directory of the user's made for it
    shown: bool = False  # its socket, port and token go into heartbeats: it was seen to serve there (issue 36)
    stopping: bool = False
    ended_at: float | None = None  # monotonic
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return protocol.launch_name(self.reservation, self.number)

    @property
    def is_container(self) -> bool:
        return self.order.kind == "container"

    @property
    def serves(self) -> bool:
        """It serves on a socket or a port: what it serves is shown once it is seen there."""
        return bool(self.socket or self.port)


class Launches:
    """The node's launches. ``step`` (any thread, one at a time) decides; starts and stops run on pools of threads."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        leases: LeaseSource,
        report: Callable[..., None],
        supervisor: Supervisor,
        changed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.leases = leases
        self.report = report
        self.supervisor = supervisor
        self.changed = changed  # a launch changed state: the reporter sends a heartbeat soon
        self.clock = clock
        self._entries: dict[str, Entry] = {}
        # Images got ready ahead of their slots, per (user, image): what the heartbeat says of them meanwhile.
        self._images: dict[tuple[str, str], str] = {}
        # Launches the node knows of but does not run yet, and what the heartbeat says of each meanwhile.
        # (A message, or the image whose message in _images is the word on it.)
        self._pending: dict[tuple[int, int], str | tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()
        # Starts and stops wait (a grace, a pull at the start): many side by side, so that a slot end that ends a
        # dozen launches ends each within its grace. Pulls ahead of slots go on their own, few at a time.
        # Stops have their own pool, so a start that waits for its image never delays a slot's end.
        self._starts = ThreadPoolExecutor(max_workers=8, thread_name_prefix="agent-launch")
        self._stops = ThreadPoolExecutor(max_workers=32, thread_name_prefix="agent-stop")
        self._pulls = ThreadPoolExecutor(max_workers=2, thread_name_prefix="agent-pull")
        self._images_at: dict[tuple[str, str], float] = {}  # when each was got ready: tried again an hour on
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- deciding ---------------------------------------------------------------------------------

    def step(self, now: datetime) -> None:
        with self._step_lock:
            wanted: dict[str, tuple[Lease, LaunchOrder, tuple[str, ...] | None]] = {}
            for lease, files in self.leases.active_leases(now):
                for order in lease.launches:
                    wanted[protocol.launch_name(lease.reservation, order.number)] = (lease, order, files)
            for lease, reason in self.leases.refused_leases(now):
                for order in lease.launches:
                    if protocol.launch_name(lease.reservation, order.number) not in self._entries:
                        self._refuse(lease, order, f"not an ordinary account here: {reason}")
            pending: dict[tuple[int, int], str | tuple[str, str]] = {}
            for name, (lease, order, files) in wanted.items():
                if name not in self._entries:
                    self._consider(name, lease, order, files)
                if name not in self._entries:
                    why = f"waiting for the booking's GPUs to open to {lease.user}"
                    pending[(lease.reservation, order.number)] = why
            with self._lock:
                entries = list(self._entries.values())
            for entry in entries:
                if entry.state in (STARTING, RUNNING) and entry.name not in wanted and not entry.stopping:
                    entry.stopping = True
                    self._stops.submit(self._guarded, self._stop_entry, entry, self._why_stopped(entry, now))
            for entry in entries:
                # Each pass, not once per exit (exit_code reaps it): one that exited before its start had marked it
                # running counts too. Stopped ones are reaped by their stop.
                code = self.supervisor.exit_code(entry.name) if entry.state == RUNNING else None
                if code is not None and not entry.stopping:
                    self._ended(entry, EXITED, code, f"exited with code {code}" + self._why_unseen(entry))
                elif entry.state == RUNNING and entry.serves and not entry.stopping:
                    self._check_endpoint(entry)
            self._pending = self._prepare_upcoming(now) | pending
            self._forget_old()

    def _prepare_upcoming(self, now: datetime) -> dict[tuple[int, int], str | tuple[str, str]]:
        """Containers of leases starting within PULL_AHEAD: their image is checked, and pulled if missing, now.
        Returns what the heartbeat says of each launch of those leases meanwhile."""
        said: dict[tuple[int, int], str | tuple[str, str]] = {}
        for lease in self.leases.upcoming_leases(now, PULL_AHEAD):
            for order in lease.launches:
                if order.problem is not None or order.kind not in self.config.launch_kinds or not order.number:
                    continue  # refused at the start, and said then
                said[(lease.reservation, order.number)] = "waiting for the slot"
                key = (lease.user, order.image)
                if order.kind != "container" or not shutil.which("podman"):
                    continue
                if key not in self._images:
                    self._images[key] = f"getting the image {order.image} ready ahead of the slot"
                    self._images_at[key] = self.clock()
                    self._pulls.submit(self._guarded, self._pull_ahead, key)
                said[(lease.reservation, order.number)] = key
        return said

    def _pull_ahead(self, key: tuple[str, str]) -> None:
        user, image = key

        def note(message: str) -> None:
            self._images[key] = message
            self.changed()

        try:
            note(self._ensure_image(user, image, note))
        except LaunchRefused as refusal:
            note(f"{refusal} (tried again at the start)")

    def _consider(self, name: str, lease: Lease, order: LaunchOrder, files: tuple[str, ...] | None) -> None:
        """A launch seen for the first time: refused now, started once its GPUs are open, or left for a later pass."""
        problem = order.problem
        if problem is None and order.kind not in self.config.launch_kinds:
            problem = f"this node runs no {order.kind}s (its LAUNCH_KINDS)"
        if problem is None and order.kind == "container" and shutil.which("podman") is None:
            problem = "this node has no podman to run containers with"
        if problem is not None:
            self._refuse(lease, order, problem)
            return
        if files is None:
            return  # the lease's GPUs are not open to its user yet: the enforcer is on it
        entry = Entry(reservation=lease.reservation, number=order.number, user=lease.user, order=order, end=lease.end)
        with self._lock:
            self._entries[name] = entry
        self._starts.submit(self._guarded, self._start_entry, entry, files)

    def _refuse(self, lease: Lease, order: LaunchOrder, problem: str) -> None:
        entry = Entry(reservation=lease.reservation, number=order.number, user=lease.user, order=order, end=lease.end)
        with self._lock:
            self._entries[entry.name] = entry
        self._ended(entry, REFUSED, None, problem)

    def _why_stopped(self, entry: Entry, now: datetime) -> str:
        lease = self.leases.lease_of(entry.reservation)
        if lease is None:
            return "the booking ended (released or cancelled)"
        if lease.end <= now:
            return "the slot ended"
        if any(refused.reservation == lease.reservation for refused, _ in self.leases.refused_leases(now)):
            return "the node no longer takes the account"
        return "stopped from the portal"

    # -- doing ------------------------------------------------------------------------------------

    def _start_entry(self, entry: Entry, files: tuple[str, ...]) -> None:
        with entry.lock:
            if entry.state != STARTING:
                return  # its stop came first and said so
            if entry.stopping:
                self._ended(entry, STOPPED, None, "stopped before it started")
                return
            try:
                account = self.supervisor.account(entry.user)  # refused here, before anything runs as them
                entry.uid = account.pw_uid
                argv = self._argv(entry, files, account)
                if entry.is_container:
                    self._ensure_image(entry.user, entry.order.image, lambda message: self._note(entry, message))
                if self._stop_asked(entry):  # while the image was pulled
                    self._ended(entry, STOPPED, None, "stopped before it started")
                    return
                self.supervisor.start(
                    LaunchSpec(
                        name=entry.name,
                        user=entry.user,
                        argv=tuple(argv),
                        env=self._connection_env(entry),
                        # A container's limits are podman's --ulimit (rlimits on podman itself would break it).
                        memory_max_bytes=None if entry.is_container else entry.order.memory_max_bytes,
                        max_processes=None if entry.is_container else entry.order.max_processes,
                        runtime_max_seconds=self._runtime_max(entry),
                        grace_seconds=self.config.grace_seconds,
                        delegate=entry.is_container,
                    )
                )
            except LaunchRefused as refusal:
                self._ended(entry, REFUSED, None, str(refusal))
                return
            except endpoints.UnsafeSocketDir as error:
                self._ended(entry, REFUSED, None, f"the node's LAUNCH_SOCKET_DIR is not safe to serve in: {error}")
                return
            except OSError as error:  # the node's side (its log directory, say): said, not left "starting"
                self._ended(entry, REFUSED, None, f"the node could not start it: {error}")
                return
            entry.shown = not entry.serves  # a server's token waits until it is seen serving where it should
            entry.message = self._waiting_word(entry)
            entry.state = RUNNING  # last: step() checks where a running launch serves, on its own thread
            self.report(
                "launch_started",
                reservation=entry.reservation,
                user=entry.user,
                launch=entry.number,
                # Not the port: it is shown once the launch is seen to hold it (another account may race for it).
                message=f"{entry.order.image or entry.order.argv[0]} as {entry.user}" + _serving_word(entry),
            )
            self.changed()

    # -- where it serves (issue 36) ---------------------------------------------------------------------

    def _check_endpoint(self, entry: Entry) -> None:
        """A running launch that serves: its socket, port and token are shown once it is seen serving there, and
        withdrawn while it is not. Another account's listener on its port refuses it: it is stopped, and its holder
        never sees that port. Each pass, not once: a port's listener can change hands while the launch runs."""
        problem = endpoints.socket_problem(entry.socket, uid=entry.uid) if entry.socket else None
        verdict = self._port_verdict(entry) if entry.port and problem is None else endpoints.PortVerdict("ours")
        if verdict.kind == "foreign":
            entry.stopping, entry.shown = True, False
            self._stops.submit(self._guarded, self._stop_entry, entry, f"refused: {verdict.message}", REFUSED)
            return
        shown = problem is None and verdict.kind == "ours"
        message = "" if shown else self._waiting_word(entry, problem or verdict.message)
        if (shown, message) != (entry.shown, entry.message):
            entry.shown, entry.message = shown, message
            self.changed()

    def _port_verdict(self, entry: Entry) -> endpoints.PortVerdict:
        assert entry.port is not None
        uid = entry.uid
        pids = set(self.supervisor.processes(entry.name))
        if entry.is_container:  # podman's monitor left the command's family when it started
            pids |= {pid for monitor in conmon_pids(uid, entry.name) for pid in family(monitor)}
        theirs = [pid for pid in pids if procfs.process_uid(pid) == uid]
        return endpoints.port_verdict(entry.port, uid=uid, pids=theirs)

    @staticmethod
    def _waiting_word(entry: Entry, detail: str = "") -> str:
        """What a launch that serves says until it is seen serving."""
        if entry.socket:
            return f"waiting for it to listen on its socket ({detail or 'no socket yet'})"
        if entry.port:  # not the number: it is the holder's once the launch is seen to hold it
            return detail or "waiting for it to listen on its port"
        return ""

    def _why_unseen(self, entry: Entry) -> str:
        """For a launch that exited before it was seen to listen on its port: another account's socket there."""
        if entry.shown or not entry.port:
            return ""
        taken = endpoints.port_taken_by_other(entry.port, uid=entry.uid)
        return f"; {taken}: its port and token were not shown" if taken else ""

    @staticmethod
    def _stop_asked(entry: Entry) -> bool:
        return entry.stopping  # set by step(), on another thread, at any moment

    def _stop_entry(self, entry: Entry, reason: str, state: str = STOPPED) -> None:
        """End a running launch; ``state`` says how it is reported (REFUSED: the node refused it while it ran)."""
        with entry.lock:
            if entry.state != RUNNING:
                if entry.state == STARTING:
                    self._ended(entry, STOPPED, None, reason)
                return
            grace = self.config.grace_seconds
            if entry.is_container:
                self._podman_stop(entry, grace)
            launch = self.supervisor.stop(entry.name, grace=grace)
            unkillable = list(launch.unkillable) if launch else []
            if entry.is_container:
                unkillable += self._end_container_monitor(entry, grace)
            code = launch.exit_code if launch else None
            message = reason + (f"; pids {', '.join(map(str, unkillable))} could not be ended" if unkillable else "")
            self._ended(entry, state, code, message)

    def _ended(self, entry: Entry, state: str, exit_code: int | None, message: str) -> None:
        entry.state, entry.exit_code, entry.message, entry.ended_at = state, exit_code, message, self.clock()
        if entry.socket:  # nothing serves there any more: the directory goes (its name is the launch's, reused never)
            try:
                endpoints.remove_socket_dir(self.config.launch_socket_dir, entry.name)
            except OSError as error:
                log.warning("launch %s: its socket directory could not be removed: %s", entry.name, error)
        kind = {EXITED: "launch_exited", STOPPED: "launch_stopped", REFUSED: "launch_refused"}[state]
        fields: dict[str, Any] = {"reservation": entry.reservation, "user": entry.user, "message": message}
        if entry.number:
            fields["launch"] = entry.number
        if exit_code is not None:
            fields["exit_code"] = max(-255, min(255, exit_code))
        (log.warning if state == REFUSED else log.info)("launch %s: %s", entry.name, message)
        self.report(kind, **fields)
        self.changed()

    def _guarded(self, job: Callable[..., None], *args: Any) -> None:
        try:
            job(*args)
        except Exception:
            log.exception("launch job %s failed", job.__name__)

    def _forget_old(self) -> None:
        """Ended launches an hour on, once their lease no longer lists them (else they would start again); image
        checks an hour on (a pull that failed is tried again)."""
        horizon = self.clock() - KEEP_ENDED_SECONDS
        with self._lock:
            old = [
                name
                for name, entry in self._entries.items()
                if entry.ended_at is not None and entry.ended_at < horizon and not self._listed(entry)
            ]
            for name in old:
                del self._entries[name]
        for name in old:
            self.supervisor.forget(name)
        for key in [key for key, at in self._images_at.items() if at < horizon]:
            self._images.pop(key, None)
            self._images_at.pop(key, None)

    def _listed(self, entry: Entry) -> bool:
        lease = self.leases.lease_of(entry.reservation)
        return lease is not None and any(order.number == entry.number for order in lease.launches)

    def end_leftovers(self) -> int:
        """Before anything starts: end what an earlier run of the agent launched and left (after a kill -9, say).
        Its processes carry the launch's MARKER, but anyone may set that variable: a marked process counts only
        when the stored snapshot has that launch's lease and the process is the lease's user's, and only that
        user's processes are ended (with a unit: the unit is stopped). A container's monitor is found by its name.
        The launches of leases still active start again, afresh. Returns how many launches were ended."""
        self.supervisor.clear_old_files()
        with self._lock:
            known = set(self._entries)
        with contextlib.suppress(OSError):  # their launches are ended below: nothing serves there any more
            endpoints.clear_socket_dirs(self.config.launch_socket_dir, keep=known)
        found: dict[str, tuple[Lease, int, int, set[int]]] = {}
        for pid, name in procfs.marked_processes(MARKER):
            owner = self._leftover_owner(name, pid)
            if owner is not None:
                found.setdefault(name, (*owner, set()))[3].add(pid)
        for name, (lease, number, uid, pids) in sorted(found.items()):
            if self.supervisor.units:
                stop_unit(name, self.config.grace_seconds)
            members = {member for pid in pids for member in family(pid)}
            members |= {member for monitor in conmon_pids(uid, name) for member in family(monitor)}
            theirs = sorted(member for member in members if procfs.process_uid(member) == uid)
            ended = cleanup.terminate(theirs, term_timeout=self.config.grace_seconds)
            self.report(
                "launch_stopped",
                reservation=lease.reservation,
                launch=number,
                user=lease.user,
                message="left running by an earlier run of the agent: ended (it starts again while its slot lasts)"
                + (f"; pids {', '.join(map(str, ended.unkillable))} could not be ended" if ended.unkillable else ""),
            )
        return len(found)

    def _leftover_owner(self, name: str, pid: int) -> tuple[Lease, int, int] | None:
        """The lease, launch number and uid a process marked ``name`` belongs to: the stored snapshot's lease lists
        that launch and the process is its user's (an ordinary account). None: not a launch of ours."""
        match = LEFTOVER_NAME_RE.match(name)
        lease = self.leases.lease_of(int(match["reservation"])) if match else None
        if match is None or lease is None or not any(o.number == int(match["number"]) for o in lease.launches):
            return None
        uid = procfs.uid_of(lease.user)
        if uid is None or uid < self.supervisor.accounts.uid_min or procfs.process_uid(pid) != uid:
            return None
        return lease, int(match["number"]), uid

    # -- the command line ---------------------------------------------------------------------------

    def _argv(self, entry: Entry, files: tuple[str, ...], account: pwd.struct_passwd) -> list[str]:
        """The command to run, its {socket}, {port} and {token} filled in (a socket in a directory made now for the
        user alone, a fresh loopback port, a fresh secret: kept for the heartbeat); for a container, the podman line
        around it."""
        order = entry.order
        if order.serves_socket:
            entry.socket = endpoints.make_socket_dir(
                self.config.launch_socket_dir, entry.name, uid=account.pw_uid, gid=account.pw_gid
            )
        if order.serves_port:
            entry.port = free_port()
        if order.serves_port or order.serves_socket or order.asks_token:  # a server gets its key, shown or not
            entry.token = secrets.token_urlsafe(24)
        command = [
            arg.replace(protocol.SOCKET_PLACEHOLDER, entry.socket)
            .replace(protocol.PORT_PLACEHOLDER, str(entry.port))
            .replace(protocol.TOKEN_PLACEHOLDER, entry.token)
            for arg in order.argv
        ]
        if not entry.is_container:
            return command
        return podman_run_argv(
            podman=self._podman(),
            options=self.config.podman_options,
            name=entry.name,
            image=order.image,
            devices=[*files, *self._shared_devices()],
            port=entry.port,
            socket_dir=os.path.dirname(entry.socket) if entry.socket else None,
            env_names=sorted(self._connection_env(entry)),
            memory_max_bytes=order.memory_max_bytes,
            max_processes=order.max_processes,
            command=command,
        )

    def _runtime_max(self, entry: Entry) -> int:
        """A unit's own timer (RuntimeMaxSec): the lease's end as known now, the grace, and a day more. The agent
        ends the launch at the slot's end itself; systemd cannot move a running unit's timer, and an extension
        made meanwhile (the same booking, a later end) must not be cut short at the old end: the timer is the
        backstop for an agent that is gone, not the slot's end."""
        left = (entry.end - datetime.now(entry.end.tzinfo)).total_seconds() + self.config.grace_seconds
        return max(1, math.ceil(left + RUNTIME_BACKSTOP.total_seconds()))

    @staticmethod
    def _connection_env(entry: Entry) -> dict[str, str]:
        """The socket, port and token also as environment variables, which only the user and root can read (a command
        line is anyone's to see in ps): GPUBOOK_SOCKET, GPUBOOK_PORT, GPUBOOK_TOKEN, and JUPYTER_TOKEN, which Jupyter
        takes by itself."""
        env = {"GPUBOOK_PORT": str(entry.port)} if entry.port else {}
        if entry.socket:
            env["GPUBOOK_SOCKET"] = entry.socket
        if entry.token:
            env |= {"GPUBOOK_TOKEN": entry.token, "JUPYTER_TOKEN": entry.token}
        return env

    def _shared_devices(self) -> list[str]:
        paths = self.config.container_devices or tuple(
            os.path.join(self.config.device_dir, name) for name in SHARED_DEVICES
        )
        return [path for path in paths if os.path.exists(path)]

    def _podman(self) -> str:
        podman = shutil.which("podman")
        if podman is None:
            raise LaunchRefused("this node has no podman to run containers with")
        return podman

    def _ensure_image(self, user: str, image: str, note: Callable[[str], None]) -> str:
        """The image in the user's own (rootless) storage, pulled as them if it is not there (``note`` says so
        meanwhile); what is the case now, in words. LaunchRefused when it cannot be had."""
        account = self.supervisor.account(user)
        podman = [self._podman(), *self.config.podman_options]
        try:
            if self.supervisor.run_as(account, [*podman, "image", "exists", image], timeout=60).returncode == 0:
                return f"the image {image} is on the node"
            note(f"pulling the image {image}")
            pulled = self.supervisor.run_as(account, [*podman, "pull", "--quiet", image], timeout=PODMAN_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise LaunchRefused(f"the image {image} could not be pulled in {PODMAN_TIMEOUT:.0f} s") from None
        if pulled.returncode != 0:
            why = (pulled.stderr.strip().splitlines() or ["podman pull failed"])[-1][:300]
            raise LaunchRefused(f"the image {image} could not be pulled: {why}")
        return f"the image {image} was pulled"

    def _note(self, entry: Entry, message: str) -> None:
        entry.message = message
        self.changed()

    def _podman_stop(self, entry: Entry, grace: float) -> None:
        """Ask podman to stop the container (SIGTERM, the grace, SIGKILL); what it leaves is ended after."""
        try:
            account = self.supervisor.account(entry.user)
            self.supervisor.run_as(
                account,
                [self._podman(), *self.config.podman_options, "stop", "--time", str(int(grace)), entry.name],
                timeout=grace + 15,
            )
        except (LaunchRefused, subprocess.TimeoutExpired, OSError) as error:
            log.warning("podman stop %s: %s; its processes are ended directly", entry.name, error)

    def _end_container_monitor(self, entry: Entry, grace: float) -> list[int]:
        """The container's monitor (conmon) leaves the command's family at start (it daemonizes): end it and
        everything under it, should podman stop have left any. Returns the pids that could not be ended."""
        try:
            uid = pwd.getpwnam(entry.user).pw_uid
        except KeyError:
            return []
        pids = sorted({pid for monitor in conmon_pids(uid, entry.name) for pid in family(monitor)})
        return cleanup.terminate(pids, term_timeout=grace).unkillable if pids else []

    # -- what the heartbeat says --------------------------------------------------------------------

    def statuses(self) -> list[protocol.LaunchStatus]:
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: (e.reservation, e.number))
        reported: list[protocol.LaunchStatus] = []
        known = {(entry.reservation, entry.number) for entry in entries}
        for (reservation, number), said in sorted(self._pending.items()):
            message = said if isinstance(said, str) else self._images.get(said, "waiting for the slot")
            if (reservation, number) not in known:
                reported.append(_waiting(reservation, number, message))
        for entry in entries:
            if not entry.number:
                continue  # a request too broken to have a number: its refusal event names the booking
            try:
                tail = self.supervisor.tail(entry.name, limit=protocol.LAUNCH_TAIL_CHARS * 2)
            except OSError:
                tail = ""
            if entry.token:  # a notebook prints its URL with the token: that is its holder's alone, not the admins'
                tail = tail.replace(entry.token, "<token>")
            reported.append(
                {
                    "reservation": entry.reservation,
                    "number": entry.number,
                    "state": entry.state,
                    "exit_code": None if entry.exit_code is None else max(-255, min(255, entry.exit_code)),
                    "message": entry.message[: protocol.TEXT_LIMITS["message"]],
                    # Where it serves, and its key, once it was seen serving there (issue 36): never a port that
                    # another account may hold.
                    "port": entry.port if entry.shown else None,
                    "token": entry.token if entry.shown else "",
                    "tail": printable(tail)[-protocol.LAUNCH_TAIL_CHARS :],
                    "socket": entry.socket if entry.shown else "",
                }
            )
        # Within what one heartbeat may carry: the open ones first, then the latest ended.
        reported.sort(key=lambda status: status["state"] in (EXITED, STOPPED, REFUSED))
        return reported[: protocol.MAX_LAUNCH_STATUSES]

    # -- the thread ---------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def start(self, clock: Callable[[], datetime]) -> None:
        def run() -> None:
            try:
                self.end_leftovers()
            except Exception:
                log.exception("ending the launches an earlier run left failed")
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    self.step(clock())
                except Exception:
                    log.exception("launch pass failed")
                self._wake.wait(PASS_SECONDS)

        self._thread = threading.Thread(target=run, name="agent-launches", daemon=True)
        self._thread.start()

    def stop_all(self, reason: str) -> None:
        """On a clean stop of the agent: every launch ends (the GPUs close too), side by side."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            running = [entry for entry in self._entries.values() if entry.state in (STARTING, RUNNING)]
        for entry in running:
            entry.stopping = True
        self._pulls.shutdown(wait=False, cancel_futures=True)
        self._starts.shutdown(wait=False, cancel_futures=True)
        list(self._stops.map(lambda entry: self._guarded(self._stop_entry, entry, reason), running))
        self._stops.shutdown(wait=False, cancel_futures=True)


def _serving_word(entry: Entry) -> str:
    if entry.socket:
        return ", serving on a Unix socket"
    return ", serving on a loopback port" if entry.port else ""


def _waiting(reservation: int, number: int, message: str) -> protocol.LaunchStatus:
    return {
        "reservation": reservation,
        "number": number,
        "state": "waiting",
        "exit_code": None,
        "message": message[: protocol.TEXT_LIMITS["message"]],
        "port": None,
        "token": "",
        "tail": "",
        "socket": "",
    }


def podman_run_argv(
    *,
    podman: str,
    options: Iterable[str],
    name: str,
    image: str,
    devices: Iterable[str],
    port: int | None,
    memory_max_bytes: int | None,
    max_processes: int | None,
    command: list[str],
    env_names: Iterable[str] = (),
    socket_dir: str | None = None,
) -> list[str]:
    """The rootless podman line for a launch: only these device files, a read-only image, no capabilities or new
    privileges, a per-user volume for /work, the launch's socket directory at the same path (``socket_dir``: the
    container's root, the user outside, makes its socket there), no network unless the command serves ``port``
    (then published on the node's loopback only)."""
    argv = [podman, *options, "run", "--rm", "--replace", "--name", name, "--read-only"]
    argv += ["--security-opt", "no-new-privileges", "--cap-drop", "all", "--pull", "never"]
    argv += ["--volume", f"{CONTAINER_VOLUME}:{CONTAINER_WORKDIR}", "--workdir", CONTAINER_WORKDIR]
    if socket_dir:
        argv += ["--volume", f"{socket_dir}:{socket_dir}:rw"]
    argv += ["--network", "none"] if port is None else ["--publish", f"127.0.0.1:{port}:{port}"]
    for path in dict.fromkeys(devices):
        argv += ["--device", f"{path}:{path}:rw"]
    for name in env_names:  # the value comes from podman's own environment: never on a command line
        argv += ["--env", name]
    if memory_max_bytes:
        argv += ["--ulimit", f"as={memory_max_bytes}:{memory_max_bytes}"]
    if max_processes:
        argv += ["--ulimit", f"nproc={max_processes}:{max_processes}"]
    return [*argv, image, *command]


def conmon_pids(uid: int, name: str, *, proc: str = procfs.PROC) -> list[int]:
    """The pids of podman's container monitors of ``uid`` for the container ``name`` (``conmon ... -n name``)."""
    found = []
    for pid in procfs.pids(proc=proc):
        with contextlib.suppress(OSError):
            if os.stat(f"{proc}/{pid}").st_uid != uid:
                continue
            with open(f"{proc}/{pid}/cmdline", "rb") as file:
                argv = file.read().split(b"\0")
            if argv and os.path.basename(argv[0]) == b"conmon" and _named(argv, name.encode()):
                found.append(pid)
    return found


def _named(argv: list[bytes], name: bytes) -> bool:
    return any(arg in (b"-n", b"--name") and value == name for arg, value in itertools.pairwise(argv))


def free_port() -> int:
    """A port free on the loopback now (the kernel's choice); the launch binds it moments later, and another account
    may bind it in between: the port is shown only once the launch holds it (endpoints.port_verdict). ``{socket}``
    has no such gap."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def printable(text: str) -> str:
    """Output fit for the portal: no NUL or other control characters (terminal colours) but newlines and tabs."""
    return "".join(ch for ch in text if ch.isprintable() or ch in "\n\t")
