"""Ending what an expired holder still runs on a GPU, without ever hitting the wrong process.

Revoking the ACL stops new opens only, so after the grace period the agent ends the holder's
processes on that GPU: SIGTERM, a wait, then SIGKILL a few times. Every signal goes through a
pidfd opened *before* anything is checked: a pidfd names one process, not a number, so a pid
that is recycled meanwhile is never signalled. The same pidfd tells when the process has exited
(it becomes readable), so waiting is a ``poll`` and not a loop over ``kill(pid, 0)``.

Callers choose the pids with ``protected`` first; ``terminate`` still refuses pid 1, the agent
itself and anything running with a uid of 0, as a last guard.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpubook_agent import procfs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    pid: int
    uid: int
    user: str | None
    name: str | None


@dataclass(frozen=True)
class TerminationResult:
    ended: list[int]
    unkillable: list[int]
    refused: list[int] = field(default_factory=list)  # never signalled: pid 1, the agent, root, a thread id


def describe(pids: Iterable[int]) -> list[Holder]:
    """Who runs each pid (real uid, account name, short name); pids that are gone are skipped."""
    holders = []
    for pid in pids:
        uid = procfs.process_uid(pid)
        if uid is None:
            continue
        holders.append(Holder(pid=pid, uid=uid, user=procfs.user_name(uid), name=procfs.process_name(pid)))
    return holders


def protected(holder: Holder, *, allow_users: frozenset[str], own_pid: int, uid_min: int) -> bool:
    """Processes the agent never ends: root's, system accounts', its own, and those of allow-listed
    accounts (a monitoring daemon that runs under a normal uid).

    By account, never by process name: any process can rename itself ("nvidia-smi"), so a name
    list would let a user keep a GPU past their slot. Daemons such as nvidia-persistenced and
    DCGM run as root or system accounts, which are protected anyway.
    """
    if holder.uid == 0 or holder.uid < uid_min or holder.pid == own_pid:
        return True
    return holder.user is not None and holder.user in allow_users


def terminate(
    pids: Iterable[int], *, term_timeout: float = 5.0, kill_retries: int = 3, kill_timeout: float = 2.0
) -> TerminationResult:
    """SIGTERM, wait ``term_timeout``, then SIGKILL and wait ``kill_timeout``, up to ``kill_retries`` times.

    ``ended`` are the pids that are gone (including those gone before we started); ``unkillable``
    those still alive at the end (uninterruptible sleep in a driver, typically).
    """
    ended: list[int] = []
    refused: list[int] = []
    live: dict[int, int] = {}  # pid -> pidfd
    opened: list[int] = []
    try:
        for pid in dict.fromkeys(pids):
            fd = _open(pid, ended, refused)
            if fd is None:
                continue
            opened.append(fd)
            # /proc is read by pid, so only after the pidfd is open, and believed only if the process
            # is still alive afterwards: then the pid cannot have been reused in between.
            status = procfs.process_status(pid)
            if _exited(fd):
                ended.append(pid)
            elif _must_not_signal(status):
                refused.append(pid)
            else:
                live[pid] = fd
        for attempt in range(1 + max(kill_retries, 0)):
            if not live:
                break
            sig, timeout = (signal.SIGTERM, term_timeout) if attempt == 0 else (signal.SIGKILL, kill_timeout)
            for fd in live.values():
                _send(fd, sig)
            for pid in _wait(live, timeout):
                del live[pid]
                ended.append(pid)
    finally:
        for fd in opened:
            os.close(fd)
    if refused:
        log.warning("refused to signal %s: pid 1, the agent itself, or a process with uid 0", refused)
    return TerminationResult(ended=ended, unkillable=list(live), refused=refused)


def _open(pid: int, ended: list[int], refused: list[int]) -> int | None:
    """A pidfd for ``pid``, or None after filing it as ended (gone) or refused."""
    if pid <= 1 or pid == os.getpid():
        refused.append(pid)
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        ended.append(pid)
    except OSError:  # EINVAL: a thread id rather than a process
        refused.append(pid)
    return None


def _must_not_signal(status: dict[str, str] | None) -> bool:
    """Root in any of its uids, pid 1 or the agent itself; unreadable means no, too: do not guess."""
    if status is None:
        return True
    try:
        uids = [int(value) for value in status.get("Uid", "").split()]
        tgid = int(status.get("Tgid", "0"))
    except ValueError:
        return True
    return not uids or 0 in uids or tgid in (0, 1, os.getpid())


def _send(fd: int, sig: signal.Signals) -> None:
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass  # exited since; the wait below sees it
    except PermissionError as error:  # not root, or another user namespace: it will show as unkillable
        log.error("cannot signal a process: %s", error)


def _exited(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _wait(live: dict[int, int], timeout: float) -> list[int]:
    """Wait until every process in ``live`` has exited or ``timeout`` passes; the pids that exited."""
    by_fd = {fd: pid for pid, fd in live.items()}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    exited: list[int] = []
    deadline = time.monotonic() + timeout
    while by_fd:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        for fd, _events in poller.poll(max(1, round(remaining * 1000))):
            poller.unregister(fd)
            exited.append(by_fd.pop(fd))
    return exited
