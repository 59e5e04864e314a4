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
import subprocess

from nodes.agent.usernames import valid_username

TIMEOUT = 10.0  # seconds; setfacl on a device file is instant, a hang means something is badly wrong
ACCESS_XATTR = "system.posix_acl_access"


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


def granted_users(path: str) -> set[str]:
    """The users with a named entry on ``path`` (a deleted account shows as its uid in digits)."""
    getfacl = _tool("getfacl")
    result = _run([getfacl, "--omit-header", "--absolute-names", "--", path])
    if result.returncode != 0:
        raise AclError(f"getfacl failed on {path}: {_message(result)}")
    return parse_users(result.stdout)


def parse_users(text: str) -> set[str]:
    """Named-user entries from ``getfacl`` output: ``user:alice:rw-`` gives ``alice``.

    The owner's ``user::`` entry, default entries, comments and the ``#effective:`` note that
    follows an entry restricted by the mask are ignored.
    """
    users: set[str] = set()
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        parts = fields[0].split(":")
        if len(parts) == 3 and parts[0] == "user" and parts[1]:
            users.add(parts[1])
    return users


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
    setfacl = _tool("setfacl")
    result = _run([setfacl, *args])
    if result.returncode == 0:
        return
    message = _message(result)
    if not user.isdigit() and _unknown(user):
        message = f"there is no user {user!r} on this node ({message})"
    raise AclError(f"cannot {action} {path} for {user!r}: {message}")


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise AclError(f"{name} is not installed: install the 'acl' package on this node")
    return found


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
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


def _message(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip() or f"exit status {result.returncode}"


def _unknown(user: str) -> bool:
    """setfacl says only 'Invalid argument' for a name it cannot resolve; say what it means."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return True
    return False
