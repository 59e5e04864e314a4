"""Reading processes from /proc: who holds which device file open, and who they are.

Revoking an ACL does not close file descriptors already open, so the agent finds the
processes that hold a GPU's device file by scanning ``/proc/<pid>/fd``. A process can vanish
at any moment during the scan; that is normal and is skipped, never an error: the readers
below return ``None`` for a process that is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import stat
import struct
from collections.abc import Iterable, Iterator
from typing import Any

PROC = "/proc"
LOGIN_DEFS = "/etc/login.defs"
DEFAULT_UID_MIN = 1000


def fd_holders(paths: Iterable[str], *, proc: str = PROC) -> dict[str, set[int]]:
    """For each path, the pids that hold the file it names open, under whatever name they opened it.

    A file is known by what it is, not by how its path is spelled: a character device by its device
    number (a GPU's ``/dev/nvidiaN``, wherever a node for it was made), anything else by its filesystem
    and inode (the stand-ins of the demo and the tests). A bind mount in a user's own mount namespace, a
    hard link or a path seen from another mount namespace all name the same file, and ``/proc/<pid>/fd``
    shows them under their other names: matching the text of the link would miss them.

    Each descriptor is first read with ``readlink``; one that names one of ``paths`` needs nothing more,
    and sockets, pipes and anonymous inodes are no files at all. The others are asked for their type and
    numbers with ``statx(AT_STATX_DONT_SYNC)`` (``file_identity``): the kernel answers from what it has
    cached, so a descriptor on a hung network filesystem cannot hang the scan.
    """
    wanted: dict[str, list[str]] = {}
    by_identity: dict[FileIdentity, list[str]] = {}
    for path in paths:
        wanted.setdefault(os.path.realpath(path), []).append(path)
        identity = file_identity(path)
        if identity is not None:
            by_identity.setdefault(identity, []).append(path)
    found: dict[str, set[int]] = {path: set() for aliases in wanted.values() for path in aliases}
    if not wanted:
        return found
    buffer = ctypes.create_string_buffer(_STATX_SIZE)
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
                link = f"{fd_dir}/{fd}"
                try:
                    target = os.readlink(link)
                except OSError:
                    continue
                named = wanted.get(target)
                if named is None and by_identity and target.startswith("/"):
                    identity = file_identity(link, buffer)
                    named = by_identity.get(identity) if identity is not None else None
                for path in named or ():
                    found[path].add(pid)
    return found


# What makes two names one file: ("char", major, minor, 0) for a character device, whatever node was opened for it;
# ("file", major, minor, inode) for anything else: the filesystem's device and the inode. A plain tuple: a scan
# makes one per descriptor.
FileIdentity = tuple[str, int, int, int]

# struct statx (include/uapi/linux/stat.h): stx_mode at 28 (u16), stx_ino at 32 (u64), stx_rdev_major,
# stx_rdev_minor, stx_dev_major, stx_dev_minor at 128-143 (u32 each); the whole struct is 256 bytes.
_STATX_SIZE = 256
_STATX_MODE, _STATX_INO, _STATX_DEVICES = struct.Struct("<H"), struct.Struct("<Q"), struct.Struct("<IIII")
_AT_FDCWD, _AT_STATX_DONT_SYNC = -100, 0x4000
_STATX_TYPE, _STATX_INO_MASK = 0x0001, 0x0100


def _libc_statx() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).statx
    except (AttributeError, OSError):  # a C library older than glibc 2.28: names are compared as text only
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)
    function.restype = ctypes.c_int
    return function


_statx = _libc_statx()


def file_identity(path: str, buffer: Any = None) -> FileIdentity | None:
    """The identity of the file ``path`` leads to (a ``/proc/<pid>/fd/N`` link: the open file itself), read
    from the kernel's cached attributes; None if it cannot be read (gone, or no statx here). ``buffer``: room
    for the answer (``ctypes.create_string_buffer(256)``) that a caller asking many times can lend."""
    if _statx is None:
        return None
    if buffer is None:
        buffer = ctypes.create_string_buffer(_STATX_SIZE)
    if _statx(_AT_FDCWD, os.fsencode(path), _AT_STATX_DONT_SYNC, _STATX_TYPE | _STATX_INO_MASK, buffer) != 0:
        return None
    (mode,) = _STATX_MODE.unpack_from(buffer, 28)
    rdev_major, rdev_minor, dev_major, dev_minor = _STATX_DEVICES.unpack_from(buffer, 128)
    if stat.S_ISCHR(mode):
        return ("char", rdev_major, rdev_minor, 0)
    return ("file", dev_major, dev_minor, _STATX_INO.unpack_from(buffer, 32)[0])


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


def held_socket_inodes(pids: Iterable[int], *, proc: str = PROC) -> set[int]:
    """The inodes of the sockets these processes hold open (``/proc/<pid>/fd/* -> socket:[inode]``)."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            names = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                target = os.readlink(f"{proc}/{pid}/fd/{name}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def cgroup_members(unit: str, *, proc: str = PROC) -> list[int]:
    """The processes in the systemd unit ``unit``'s cgroup (or one below it, as podman makes with Delegate=yes),
    read from ``/proc/<pid>/cgroup``. Only root and systemd can move a process into a system unit's cgroup."""
    marker = f"/{unit}"
    members = []
    for pid in pids(proc=proc):
        try:
            with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as file:
                lines = file.read().splitlines()
        except OSError:
            continue
        for line in lines:
            path = line.split(":", 2)[-1]
            if path.endswith(marker) or f"{marker}/" in path:
                members.append(pid)
                break
    return members


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
