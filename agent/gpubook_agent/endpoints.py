"""Where a launch serves, so that no other account on the node can take its place (issue 36).

A port picked free now and bound by the command moments later can be taken by any account on the node in between:
the port is on the command's line (``/proc/<pid>/cmdline``), and the loopback is everyone's. The launch then fails
or, worse, its holder is shown a tunnel to the other account's server and types their token there. So:

- **A Unix socket** (``{socket}``): the launch serves on ``<LAUNCH_SOCKET_DIR>/<launch>/socket``. LAUNCH_SOCKET_DIR
  is root's, 0755, reached only through directories no other account can change; the launch's directory in it is
  the user's, 0700, made by the agent without following links and removed when the launch ends. No other account
  can enter it: not to connect, not to bind the path first, not to replace the socket or plant a link. The holder
  reaches it as themselves over ssh (``ssh -N -L 8888:<path> user@node``, which sshd opens as the user).
- **A TCP port** (``{port}``), for a command that can serve nothing else: the agent shows the port (and the token)
  only once every listener that a connection to 127.0.0.1:<port> could reach is a socket the launch's user made
  and the launch's own processes hold (``port_verdict``). Another account's listener refuses the launch, in words.
  The check runs after the command listens and before anything is shown, and again on every pass while it runs.

Linux only: it reads ``/proc/net/tcp``, ``/proc/net/tcp6`` and ``/proc/<pid>/fd`` (root reads every process's).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from gpubook_agent import procfs
from gpubook_agent.protocol import MAX_SOCKET_PATH_CHARS

SOCKET_NAME = "socket"
# LAUNCH_SOCKET_DIR's own characters: it is printed in an ssh command that people paste into a shell, and it goes
# on podman's --volume line (no ":" or ",").
SOCKET_DIR_RE = re.compile(r"\A(/[A-Za-z0-9._-]+)+\Z")
# gpubook-<reservation>-<number> (at most 18 and 7 digits, launches.LEFTOVER_NAME_RE) and /socket.
LONGEST_TAIL = len("/gpubook-") + 18 + 1 + 7 + len("/" + SOCKET_NAME)
MAX_SOCKET_DIR_CHARS = MAX_SOCKET_PATH_CHARS - LONGEST_TAIL
LAUNCH_DIR_RE = re.compile(r"\Agpubook-[0-9]{1,18}-[0-9]{1,7}\Z")
TCP_LISTEN = 0x0A  # the state column of /proc/net/tcp: include/net/tcp_states.h, TCP_LISTEN
# Local addresses a connection to 127.0.0.1 can land on, in the order the kernel prefers them: the loopback address
# itself, then an IPv4 wildcard, then an IPv6 wildcard (which takes IPv4 only unless it is IPV6_V6ONLY, which
# /proc/net/tcp6 does not show). Only the first kind present receives connections (``receiving_listeners``).
EXACT_LOOPBACK = frozenset({"127.0.0.1", "::ffff:127.0.0.1"})
IPV4_WILDCARD = frozenset({"0.0.0.0", "::ffff:0.0.0.0"})  # noqa: S104
IPV6_WILDCARD = frozenset({"::"})
REACHES_LOOPBACK = EXACT_LOOPBACK | IPV4_WILDCARD | IPV6_WILDCARD


class UnsafeSocketDir(Exception):
    """LAUNCH_SOCKET_DIR, or a launch's directory in it, is not one the agent can vouch for: the message says why."""


def socket_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be LAUNCH_SOCKET_DIR, in words (config.py checks it when loaded); None when it can."""
    if not SOCKET_DIR_RE.match(path) or os.path.normpath(path) != path or "/../" in f"{path}/" or "/./" in f"{path}/":
        return "an absolute path of letters, digits, '.', '_' and '-' (like /run/gpubook-launches)"
    if len(path) > MAX_SOCKET_DIR_CHARS:
        return (
            f"at most {MAX_SOCKET_DIR_CHARS} characters: a launch's socket path under it must fit a Unix socket's "
            f"{MAX_SOCKET_PATH_CHARS}"
        )
    return None


def prepare_root(path: str) -> None:
    """Make LAUNCH_SOCKET_DIR (root's, 0755) and the directories above it that are missing; UnsafeSocketDir when it,
    or any directory above it, is a link, or is not root's, or another account could rename things in it (a
    world-writable directory counts only with its sticky bit, as /tmp has)."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            pass
        else:  # whatever the agent's umask: users pass through it to their launch's directory
            os.chmod(current, 0o755)  # noqa: S103
        info = os.lstat(current)
        sticky_world = bool(info.st_mode & stat.S_ISVTX) and current != path
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise UnsafeSocketDir(f"{current} is not a directory (a link or a file): LAUNCH_SOCKET_DIR must be one")
        if info.st_uid != 0:
            raise UnsafeSocketDir(f"{current} belongs to uid {info.st_uid}, not root")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_world:
            raise UnsafeSocketDir(f"{current} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})")
    if stat.S_IMODE(os.lstat(path).st_mode) & 0o555 != 0o555:
        os.chmod(path, 0o755)  # noqa: S103 - users must reach their own launch's directory through it


def make_socket_dir(root: str, name: str, *, uid: int, gid: int) -> str:
    """The launch ``name``'s directory in ``root`` (prepare_root's), made anew: the user's, 0700, never through a
    link (a leftover of the same name, from a run the agent did not see end, is removed first). Returns the path
    of the socket in it, which the command creates."""
    if not LAUNCH_DIR_RE.match(name):
        raise UnsafeSocketDir(f"bad launch name {name!r}")
    prepare_root(root)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _remove_in(root_fd, name)
        os.mkdir(name, 0o700, dir_fd=root_fd)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o700)  # the umask may have taken bits away; nothing may add any
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)
    return os.path.join(root, name, SOCKET_NAME)


def remove_socket_dir(root: str, name: str) -> None:
    """The launch's directory and all in it, gone (its user may have put links there: none is followed)."""
    if not LAUNCH_DIR_RE.match(name):
        return
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        _remove_in(root_fd, name)
    finally:
        os.close(root_fd)


def clear_socket_dirs(root: str, *, keep: Iterable[str] = ()) -> int:
    """At the agent's start: the launch directories an earlier run left (their launches are ended). Returns how
    many went."""
    kept, removed = set(keep), 0
    try:
        names = [entry.name for entry in os.scandir(root)]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for name in names:
        if LAUNCH_DIR_RE.match(name) and name not in kept:
            remove_socket_dir(root, name)
            removed += 1
    return removed


def _remove_in(root_fd: int, name: str) -> None:
    # shutil.rmtree with dir_fd follows no link on Linux (rmtree.avoids_symlink_attacks): a link the user placed in
    # their directory is removed, never what it points to.
    try:
        info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=root_fd)
    else:
        os.unlink(name, dir_fd=root_fd)


def socket_problem(path: str, *, uid: int) -> str | None:
    """Whether the launch serves on its socket now: None when ``path`` is a socket its user made, in their own
    directory that no one else may write to; else what is missing, in words."""
    directory = os.path.dirname(path)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return f"its directory {directory} is gone"
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its directory {directory} is no longer its user's alone"
    try:
        made = os.lstat(path)
    except FileNotFoundError:
        return "no socket yet"
    if not stat.S_ISSOCK(made.st_mode):
        return f"{path} is not a socket"
    if made.st_uid != uid:
        return f"{path} was made by uid {made.st_uid}, not the launch's user"
    return None


# -- TCP: whose listener is it? --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TcpSocket:
    """One line of /proc/net/tcp or tcp6."""

    address: str
    port: int
    state: int
    uid: int  # who made the socket
    inode: int


def tcp_sockets(*, proc: str = procfs.PROC) -> list[TcpSocket]:
    """Every TCP socket of the agent's network namespace (the node's), IPv4 and IPv6."""
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"{proc}/net/{table}", encoding="ascii", errors="replace") as file:
                lines = file.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            with contextlib.suppress(ValueError, IndexError, OSError):
                fields = line.split()
                address, port = fields[1].split(":")
                found.append(
                    TcpSocket(
                        address=_address(address, family),
                        port=int(port, 16),
                        state=int(fields[3], 16),
                        uid=int(fields[7]),
                        inode=int(fields[9]),
                    )
                )
    return found


def _address(hex_address: str, family: int) -> str:
    """The kernel prints each 32-bit word of the address as a number in the machine's byte order."""
    raw = b"".join(int(hex_address[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_address), 8))
    return socket.inet_ntop(family, raw)


def loopback_listeners(port: int, *, proc: str = procfs.PROC) -> list[TcpSocket]:
    """The listeners a connection to 127.0.0.1:``port`` could land on (an ssh tunnel's, the holder's)."""
    return [
        item
        for item in tcp_sockets(proc=proc)
        if item.port == port and item.state == TCP_LISTEN and item.address in REACHES_LOOPBACK
    ]


def receiving_listeners(listeners: list[TcpSocket]) -> tuple[list[TcpSocket], bool]:
    """Of ``loopback_listeners``, those a connection to 127.0.0.1 lands on, and whether that is certain. The kernel
    takes a listener bound to the address itself before a wildcard, and an IPv4 wildcard before an IPv6 one (a
    listener's score: Linux's inet_lhash2 lookup and compute_score), and two sockets share one such place only
    with SO_REUSEPORT, which the kernel allows for one account alone. An IPv6 wildcard alone is uncertain: it may
    be IPV6_V6ONLY and take no IPv4 at all. So another account's IPv6-only listener beside the launch's own on
    127.0.0.1 changes nothing (it used to refuse any launch on a port: anyone could stop one)."""
    for addresses in (EXACT_LOOPBACK, IPV4_WILDCARD):
        found = [item for item in listeners if item.address in addresses]
        if found:
            return found, True
    return [item for item in listeners if item.address in IPV6_WILDCARD], False


@dataclass(frozen=True)
class PortVerdict:
    """What ``port_verdict`` found: ``ours`` (show the port), ``waiting`` (nothing listens yet) or ``foreign``."""

    kind: str
    message: str = ""


def port_verdict(port: int, *, uid: int, pids: Iterable[int], proc: str = procfs.PROC) -> PortVerdict:
    """Whether the launch of user ``uid`` whose processes are ``pids`` is what a connection to 127.0.0.1:``port``
    reaches: every listener it lands on (``receiving_listeners``) must be a socket ``uid`` made, held open by one of
    ``pids``. One that is not is ``foreign``, with words naming its account (the holder is never shown that port).
    An IPv6 wildcard that is not the launch's, with nothing on IPv4, keeps it ``waiting`` rather than refused: it
    may take no IPv4 at all, and the launch may still bind 127.0.0.1 beside it."""
    receivers, certain = receiving_listeners(loopback_listeners(port, proc=proc))
    if not receivers:
        return PortVerdict("waiting", "waiting for it to listen on its port")
    held = procfs.held_socket_inodes(pids, proc=proc)
    for listener in receivers:
        problem = None
        if listener.uid != uid:
            problem = f"is held by another account ({procfs.user_label(listener.uid)}), not by the launch"
        elif listener.inode not in held:
            problem = "is held by a process outside the launch"
        if problem and not certain:
            return PortVerdict("waiting", "waiting for it to listen on its port on 127.0.0.1")
        if problem:
            return PortVerdict(
                "foreign", f"port {port} on the node's loopback {problem}: its port and token were not shown"
            )
    return PortVerdict("ours")


def port_taken_by_other(port: int, *, uid: int, proc: str = procfs.PROC) -> str | None:
    """For a launch that ended before it was seen to listen: another account's socket on its port (bound or
    listening, on an address the holder's connection could reach), in words; None when there is none."""
    for item in tcp_sockets(proc=proc):
        if item.port == port and item.uid != uid and item.address in REACHES_LOOPBACK and item.inode:
            return f"port {port} was taken by another account ({procfs.user_label(item.uid)}) first"
    return None
