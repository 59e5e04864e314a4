"""Reading processes from /proc: who holds which device file open, and who they are.

Revoking an ACL does not close file descriptors already open, so the agent finds the
processes that hold a GPU's device file by scanning ``/proc/<pid>/fd``. A process can vanish
at any moment during the scan; that is normal and is skipped, never an error: the readers
below return ``None`` for a process that is gone.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Iterator

PROC = "/proc"
LOGIN_DEFS = "/etc/login.defs"
DEFAULT_UID_MIN = 1000


def fd_holders(paths: Iterable[str], *, proc: str = PROC) -> dict[str, set[int]]:
    """For each path, the pids that hold it open (paths compared after resolving symlinks).

    Only ``readlink`` is used on the descriptors, never ``stat``: a descriptor on a hung network
    filesystem must not hang the scan.
    """
    wanted: dict[str, list[str]] = {}
    for path in paths:
        wanted.setdefault(os.path.realpath(path), []).append(path)
    found: dict[str, set[int]] = {path: set() for aliases in wanted.values() for path in aliases}
    if not wanted:
        return found
    try:
        entries = os.scandir(proc)
    except OSError:
        return found
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            fd_dir = f"{proc}/{pid}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:  # gone, or not ours to read
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"{fd_dir}/{fd}")
                except OSError:
                    continue
                for path in wanted.get(target, ()):
                    found[path].add(pid)
    return found


def pids(*, proc: str = PROC) -> list[int]:
    """Every process's pid now (none if /proc cannot be read)."""
    try:
        return [int(entry.name) for entry in os.scandir(proc) if entry.name.isdigit()]
    except OSError:
        return []


def process_tree(*, proc: str = PROC) -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, session id) of every process, from ``/proc/<pid>/stat``."""
    for name in pids(proc=proc):
        try:
            with open(f"{proc}/{name}/stat", "rb") as file:
                text = file.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": the name may hold spaces and parens
        if len(fields) >= 4:
            yield name, int(fields[1]), int(fields[3])


def marked_processes(key: str, *, proc: str = PROC) -> Iterator[tuple[int, str]]:
    """(pid, value) of every process whose environment, as it started, sets ``key`` (``/proc/<pid>/environ``, which
    root reads for every process). A process may have changed its environment since: this finds what did not."""
    prefix = key.encode() + b"="
    for name in pids(proc=proc):
        try:
            with open(f"{proc}/{name}/environ", "rb") as file:
                variables = file.read().split(b"\0")
        except OSError:
            continue
        for variable in variables:
            if variable.startswith(prefix):
                yield name, variable[len(prefix) :].decode("ascii", "replace")
                break


def process_status(pid: int, *, proc: str = PROC) -> dict[str, str] | None:
    """The fields of ``/proc/<pid>/status`` as text (``{"Uid": "1000\\t1000\\t1000\\t1000", ...}``)."""
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8", errors="replace") as file:
            text = file.read()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


def process_uids(pid: int, *, proc: str = PROC) -> tuple[int, ...] | None:
    """Real, effective, saved and filesystem uids of ``pid``; ``None`` if it is gone."""
    status = process_status(pid, proc=proc)
    if status is None or "Uid" not in status:
        return None
    try:
        return tuple(int(value) for value in status["Uid"].split())
    except ValueError:
        return None


def process_uid(pid: int, *, proc: str = PROC) -> int | None:
    """The real uid: the account that started the process, which is whose lease it runs under."""
    uids = process_uids(pid, proc=proc)
    return uids[0] if uids else None


def process_name(pid: int, *, proc: str = PROC) -> str | None:
    """The kernel's short name (``comm``): at most 15 characters, and the process may change it."""
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as file:
            return file.read().rstrip("\n")
    except OSError:
        return None


def uid_min(path: str = LOGIN_DEFS) -> int:
    """``UID_MIN`` from login.defs: below it are system accounts, which the agent never touches."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return DEFAULT_UID_MIN
    value = DEFAULT_UID_MIN
    for line in lines:  # the last setting wins, as in shadow's own reader
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and fields[0] == "UID_MIN":
            try:
                value = int(fields[1], 0)  # login.defs numbers may be written in hex, like strtol(..., 0)
            except ValueError:
                value = DEFAULT_UID_MIN
    return value if value > 0 else DEFAULT_UID_MIN


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def user_label(uid: int) -> str:
    """The account's name, or the uid in digits when no account has it (a deleted one: getfacl shows that too)."""
    return user_name(uid) or str(uid)


def uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except (KeyError, ValueError, TypeError):
        return None
