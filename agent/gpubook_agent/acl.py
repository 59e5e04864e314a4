"""Giving and taking a GPU with a POSIX ACL entry ``u:<user>:rw`` on its device file.

The agent runs as root and every name here ends up on a command line, so each username is
checked against the portal's rule *before* any process starts, commands are argument lists
(never a shell), and ``--`` ends the options so a path cannot pose as one. The tools are found
with ``shutil.which`` at call time: a node without the ``acl`` package gets a clear error, not
a traceback.

Revoking only stops new opens: descriptors already open stay valid, which is why
``cleanup`` exists.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import struct
import subprocess
from collections.abc import Sequence

from gpubook_agent import procfs
from gpubook_agent.usernames import valid_username

TIMEOUT = 10.0  # seconds; setfacl on a device file is instant, a hang means something is badly wrong
ACCESS_XATTR = "system.posix_acl_access"
XATTR_HEADER, XATTR_ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
XATTR_VERSION, ACL_USER = 2, 0x02


class AclError(ValueError):
    """An ACL could not be read or changed; the message says why (it is reported to the portal)."""


def grant(path: str, user: str) -> None:
    """Let ``user`` open ``path`` for reading and writing (the mask is recalculated to allow it)."""
    _check_user(user, deleted_ok=False)
    _setfacl(["-m", f"u:{user}:rw", "--", path], path=path, user=user, action="grant")


def revoke(path: str, user: str) -> None:
    """Remove ``user``'s entry; an entry that is not there is fine.

    ``user`` may be a uid in digits: that is how ``granted_users`` shows an entry left behind by
    a deleted account, which must still be removable.
    """
    _check_user(user, deleted_ok=True)
    _setfacl(["-x", f"u:{user}", "--", path], path=path, user=user, action="revoke")


def change(path: str, *, revoke: Sequence[str] = (), grant: Sequence[str] = ()) -> None:
    """Remove and add entries in one setfacl call: one process instead of several, and the file
    never shows both the old and the new holder of a hand-over. All or nothing: if any part
    fails (an unknown user), nothing changes, and the caller falls back to one call each."""
    change_many([path], revoke=revoke, grant=grant)


def change_many(paths: Sequence[str], *, revoke: Sequence[str] = (), grant: Sequence[str] = ()) -> None:
    """``change`` on several files that change alike, in one setfacl call (a MIG slice's device and
    capability files at its start). All or nothing per file, not across them: after a failure the
    caller goes file by file (a change already made is made again, harmlessly)."""
    for user in revoke:
        _check_user(user, deleted_ok=True)
    for user in grant:
        _check_user(user, deleted_ok=False)
    args = [arg for user in revoke for arg in ("-x", f"u:{user}")]
    args += [arg for user in grant for arg in ("-m", f"u:{user}:rw")]
    if args and paths:
        _setfacl([*args, "--", *paths], path=", ".join(paths), user=",".join([*revoke, *grant]), action="change")


def granted_users(path: str) -> set[str]:
    """The users with a named entry on ``path`` (a deleted account shows as its uid in digits).

    Read straight from the ``system.posix_acl_access`` attribute, not through getfacl: the full
    reconcile reads every GPU's ACL every few seconds, and a process per GPU would delay the
    boundaries that fall during it. The layout is the kernel's stable ABI
    (include/uapi/linux/posix_acl_xattr.h): a 4-byte version (2), then 8-byte entries
    ``tag:u16, perm:u16, id:u32``, little-endian; named users have tag ACL_USER (0x02).
    """
    return {procfs.user_label(uid) for uid in user_ids(path)}


def user_ids(path: str) -> list[int]:
    """The uids of the named-user entries on ``path`` (none when it has no extended ACL)."""
    try:
        raw = os.getxattr(path, ACCESS_XATTR, follow_symlinks=False)
    except OSError as error:
        if error.errno == errno.ENODATA:  # no extended ACL: nobody is named
            return []
        raise AclError(f"cannot read the ACL of {path}: {error.strerror}") from error
    return parse_xattr_user_ids(raw)


def parse_xattr_user_ids(raw: bytes) -> list[int]:
    """The uids of the named-user entries in a ``system.posix_acl_access`` value."""
    if len(raw) < XATTR_HEADER.size or (len(raw) - XATTR_HEADER.size) % XATTR_ENTRY.size:
        raise AclError(f"unexpected ACL attribute of {len(raw)} bytes")
    (version,) = XATTR_HEADER.unpack_from(raw)
    if version != XATTR_VERSION:
        raise AclError(f"unexpected ACL attribute version {version}")
    entries = XATTR_ENTRY.iter_unpack(raw[XATTR_HEADER.size :])
    return [uid for tag, _perm, uid in entries if tag == ACL_USER]


def acls_supported(path: str) -> bool:
    """Whether the filesystem under ``path`` keeps POSIX ACLs (asked directly, no tool needed)."""
    try:
        os.getxattr(path, ACCESS_XATTR)
    except OSError as error:
        return error.errno == errno.ENODATA  # no ACL yet, but one can be set; not EOPNOTSUPP
    return True


def _check_user(user: object, *, deleted_ok: bool) -> None:
    if valid_username(user):
        return
    if deleted_ok and isinstance(user, str) and user.isascii() and user.isdigit():
        return
    raise AclError(f"{user!r} is not a username the agent may give or take a GPU for")


def _setfacl(args: list[str], *, path: str, user: str, action: str) -> None:
    setfacl = tool("setfacl")
    # -P: never follow a symlink, so a link planted in a writable device directory cannot turn
    # a grant into an ACL on some other file.
    result = run([setfacl, "-P", *args])
    if result.returncode == 0:
        return
    message = failure_message(result)
    if not user.isdigit() and _unknown(user):
        message = f"there is no user {user!r} on this node ({message})"
    raise AclError(f"cannot {action} {path} for {user!r}: {message}")


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise AclError(f"{name} is not installed: install the 'acl' package on this node")
    return found


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a tool with messages in English (they are parsed by people and by ``_unknown``)."""
    try:
        return subprocess.run(  # noqa: S603 - an argument list of checked values, no shell
            command,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired as error:
        raise AclError(f"{os.path.basename(command[0])} did not finish within {TIMEOUT:g}s") from error
    except OSError as error:
        raise AclError(f"cannot run {command[0]}: {error}") from error


def failure_message(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip() or f"exit status {result.returncode}"


def _unknown(user: str) -> bool:
    """setfacl says only 'Invalid argument' for a name it cannot resolve; say what it means."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return True
    return False
