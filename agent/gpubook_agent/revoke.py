"""``gpubook-agent revoke-all``: take back what the agent granted, once the agent is gone.

An agent that stops by any way its code sees takes every grant back itself (main.py). One that is killed
(SIGKILL, the OOM killer, a crash of the interpreter) cannot: its grants stay until it runs again, and until then
nothing ends a slot. systemd runs this command after the agent's process is gone, whatever ended it
(``ExecStopPost=`` in deploy/gpubook-agent.service), so a killed agent leaves the GPUs closed too.

It reads only the agent's own grant ledger in STATE_DIR (store.py: the entries the agent made and had not taken
back, written before each grant, signed with the lease secret) and removes exactly those: an ACL entry an admin
set by hand stays, and nothing here opens the GPU backend or talks to the portal or the broker, so it works
whatever else is broken. It refuses to run beside a live agent (which would grant again what it took: stop the
agent instead, which revokes by itself). The next start reconciles as always: grants the stored snapshot backs
come back, and what the holders of ended slots left running is ended.
"""

from __future__ import annotations

import os
import stat
import sys

from gpubook_agent import acl
from gpubook_agent.config import ConfigError, load_state_settings
from gpubook_agent.store import SnapshotStore, StateDirLocked, StateFileIgnored, UnsafeStateDir

PROG = "gpubook-agent revoke-all"


def main(config_path: str | None) -> int:
    """0: nothing is left granted (or nothing was); 1: some entries could not be removed (kept in the ledger for
    the next try) or the ledger is not trusted; 2: the config or STATE_DIR cannot be used, or the agent runs."""
    try:
        # STATE_DIR and LEASE_SECRET alone: a config broken by an edit since the agent started must not keep the
        # GPUs open after a kill (the rest of it is the agent's business, which refuses to start with it).
        state_dir, secret = load_state_settings(config_path)
    except ConfigError as error:
        return _fail(str(error), 2)
    store = SnapshotStore(state_dir)
    try:
        store.hold_lock(create=False)
    except FileNotFoundError:
        print(f"{PROG}: no STATE_DIR {state_dir}: the agent never ran here, nothing to revoke")
        return 0
    except StateDirLocked as error:
        return _fail(f"{error}: stop it instead (it takes its grants back itself)", 2)
    except (UnsafeStateDir, OSError) as error:
        return _fail(str(error), 2)
    try:
        return revoke_ledger(store, secret=secret)
    finally:
        store.release_lock()


def revoke_ledger(store: SnapshotStore, *, secret: str) -> int:
    try:
        grants = store.load_grants(secret=secret)
    except StateFileIgnored as untrusted:
        return _fail(f"the grant ledger is not trusted, so nothing was revoked: {untrusted}", 1)
    if not grants:
        print(f"{PROG}: nothing to revoke")
        return 0
    left: set[tuple[str, str]] = set()
    for path, user in sorted(grants):
        problem = _revoke(path, user)
        if problem is None:
            print(f"{PROG}: revoked {user} on {path}")
        elif problem:
            left.add((path, user))
            print(f"{PROG}: cannot revoke {user} on {path}: {problem}", file=sys.stderr)
    try:
        store.rewrite_grants(left, secret=secret)
    except OSError as error:
        print(f"{PROG}: cannot write the grant ledger {store.grants_path}: {error}", file=sys.stderr)
        return 1
    return 1 if left else 0


def _revoke(path: str, user: str) -> str | None:
    """None once ``user``'s entry is off ``path``; "" when there is nothing to take back (the file is gone, or is
    no longer a device or a plain file); otherwise why it failed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as error:
        return error.strerror or str(error)
    if not (stat.S_ISCHR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return ""  # a link or anything else put in its place since: never followed, never changed
    try:
        acl.revoke(path, user)
    except acl.AclError as error:
        return str(error)
    return None


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return status
