"""What the agent keeps on disk: the newest accepted snapshot, the revocations of the last day, and the grants it
has made (the ledger ``gpubook-agent revoke-all`` reads once the agent is gone).

Both live in ``STATE_DIR``, which the agent trusts only while it is its own: owned by the agent's
uid (root on a node) and writable by nobody else (``UnsafeStateDir`` otherwise; the agent refuses
to start, and every read or write here refuses too). Whoever can write there could otherwise plant
files that steer the agent. Every operation opens the directory, checks that open directory, and
works relative to it, so a directory swapped in after a check is never used.

Files are opened with ``O_NOFOLLOW`` and must be regular files of the agent's own: a symbolic link
(to ``/etc/shadow``, or to a file someone else controls) is never read from or written through.
Writes are atomic (a new temporary file, created exclusively and without following links, fsync,
rename over the old name, fsync of the directory): after a crash a file holds either the old content
or the new one, never half of each, and a rename replaces a link instead of following it.

The stored snapshot carries the portal's signature and is verified again when it is read back. The
revocation log and the grant ledger are the agent's own: they are signed with the lease secret
(``signing.py``, as snapshots are), so a file edited on disk is ignored rather than believed.

A running agent holds an exclusive lock on ``agent.lock`` in STATE_DIR (``hold_lock``): a second agent on the
same directory refuses to start, and ``revoke-all`` refuses to run beside a live agent (which would grant again
what it took). The kernel drops the lock with the process, however it ends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import secrets
import stat
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from gpubook_agent import signing

REVOCATION_LOG = "revocation-log"  # the signed log's "kind": a snapshot's signature can never pass for it
GRANT_LEDGER = "grant-ledger"  # the ledger's "kind", likewise
Grants = set[tuple[str, str]]  # the grant ledger's entries: (file, user)
MAX_STATE_FILE_BYTES = 64 * 1024 * 1024  # far above any real snapshot (a day of leases) or log


class StateFileIgnored(Exception):
    """A state file exists but is not used; the message says why (the agent reports it)."""


class UnsafeStateDir(OSError):
    """STATE_DIR is not the agent's own: someone else could write there. The message names the path,
    the owner and mode found, and the fix."""

    def __init__(self, path: Path, *, owner: str, mode: int, fix: str) -> None:
        self.path, self.owner, self.mode, self.fix = path, owner, mode, fix
        self.problem = (
            f"STATE_DIR {path} is owned by {owner} with mode {mode:04o}: no account but the agent's own "
            f"({_account(os.geteuid())}) may write there, or whoever can could plant the files that decide "
            "what the agent trusts at start"
        )
        super().__init__(f"{self.problem}; fix: {fix}")


def state_dir_fix(path: str | Path) -> str:
    """The commands that make ``path`` the agent's own (``chown root: DIR; chmod 700 DIR`` on a node)."""
    return f"chown {_account(os.geteuid())}: {path}; chmod 700 {path}"


def _check_directory(path: Path, info: os.stat_result) -> None:
    """Raise UnsafeStateDir unless the directory ``info`` describes is owned by this process's uid and
    not writable by group or others (the group bits also show an ACL's mask, so a named ACL entry with
    write access shows here too)."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid() or mode & 0o022:
        name = _account(info.st_uid)
        owner = name if name.startswith("uid ") else f"{name} (uid {info.st_uid})"
        raise UnsafeStateDir(path, owner=owner, mode=mode, fix=state_dir_fix(path))


class StateDirLocked(OSError):
    """Another process (a running agent) holds STATE_DIR's lock."""


class SnapshotStore:
    FILENAME = "snapshot.json"
    REVOCATIONS = "revoked.json"
    GRANTS = "granted.log"
    LOCK = "agent.lock"

    def __init__(self, state_dir: str | Path) -> None:
        self.directory = Path(state_dir)
        self.path = self.directory / self.FILENAME
        self.revocations_path = self.directory / self.REVOCATIONS
        self.grants_path = self.directory / self.GRANTS
        self._lock_fd: int | None = None
        self._grant_fd: int | None = None  # the ledger, open for appending
        self._grant_seq = 1  # the number of the ledger's next line
        self._grant_lines = 0
        self._grant_damaged = False  # the journal takes no append: the next change rewrites it whole

    def prepare(self) -> None:
        """Create STATE_DIR (0700) if it is missing, then check it is the agent's own: UnsafeStateDir if
        not, another OSError if it cannot be used at all (not a directory, not reachable)."""
        os.close(self._open_directory(create=True))

    def hold_lock(self, *, create: bool = True) -> None:
        """Take STATE_DIR's lock for as long as this process lives (or until ``release_lock``); StateDirLocked when
        another process holds it (its pid in the message, as it wrote it). FileNotFoundError when STATE_DIR does
        not exist and ``create`` is false."""
        directory = self._open_directory(create=create)
        try:
            fd = os.open(self.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=directory)
        finally:
            os.close(directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StateDirLocked(f"an agent (pid {holder}) is running with STATE_DIR {self.directory}") from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def launch_log_dir(self) -> str:
        """Where the launches' output goes (launches.py): ``launches/`` in STATE_DIR, root's alone (0700), made
        now if missing. Each log is opened without following links, so nothing a user placed redirects it."""
        path = self.directory / "launches"
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        return str(path)

    # -- the snapshot --------------------------------------------------------------------------

    def load(self) -> dict[str, Any] | None:
        """The stored snapshot as it is on disk (not verified here), None if there is none;
        StateFileIgnored if there is one that cannot be used, with the reason."""
        raw = self._read(self.FILENAME)
        if raw is None:
            return None
        data = _parse_json(self.path, raw)
        if not isinstance(data, dict):
            raise StateFileIgnored(f"{self.path}: not a JSON object")
        return data

    def save(self, snapshot: dict[str, Any]) -> None:
        self._write(self.FILENAME, snapshot)

    # -- the revocation log ----------------------------------------------------------------------

    def load_revocations(self, *, secret: str) -> dict[tuple[str, str], datetime]:
        """Recent revocations, (gpu, user) -> when: a restarted agent still ends what they left. Empty
        when there is no log; StateFileIgnored when the log is unusable, unsigned or signed otherwise
        (an edited log is not believed: it would let its editor choose whose processes are ended)."""
        raw = self._read(self.REVOCATIONS)
        if raw is None:
            return {}
        data = _parse_json(self.revocations_path, raw)
        if not isinstance(data, dict) or data.get("kind") != REVOCATION_LOG:
            raise StateFileIgnored(f"{self.revocations_path}: not a revocation log")
        if not _signed_by(data, secret):
            raise StateFileIgnored(f"{self.revocations_path}: bad or missing signature")
        rows = data.get("revocations")
        if not isinstance(rows, list):
            raise StateFileIgnored(f"{self.revocations_path}: no list of revocations")
        revocations: dict[tuple[str, str], datetime] = {}
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3 and all(isinstance(item, str) for item in row)):
                raise StateFileIgnored(f"{self.revocations_path}: malformed entry {str(row)[:100]}")
            gpu, user, at = row
            try:
                when = datetime.fromisoformat(at)
            except ValueError:
                raise StateFileIgnored(f"{self.revocations_path}: malformed time {at[:40]!r}") from None
            if when.tzinfo is None:
                raise StateFileIgnored(f"{self.revocations_path}: a time without a zone, {at[:40]!r}")
            revocations[(gpu, user)] = when
        return revocations

    def save_revocations(self, revocations: dict[tuple[str, str], datetime], *, secret: str) -> None:
        rows = [[gpu, user, at.isoformat()] for (gpu, user), at in sorted(revocations.items())]
        self._write(self.REVOCATIONS, signing.signed({"kind": REVOCATION_LOG, "revocations": rows}, secret))

    # -- the grant ledger --------------------------------------------------------------------------
    # A journal, one signed line per change: "+" before a grant is made, "-" once it is taken back. An append costs
    # microseconds where rewriting a file costs a few hundred, and it sits on the path of every slot's start. The
    # agent rewrites it whole (``rewrite_grants``) now and then, off that path, so it stays short.

    def load_grants(self, *, secret: str) -> Grants:
        """The ACL entries the agent made and has not taken back, (file, user): what ``revoke-all`` removes once
        the agent is gone. Empty when there is no ledger; StateFileIgnored when it is unusable, a line is unsigned
        or signed otherwise, or lines are missing in between (an edited ledger would let its editor choose whose
        access is removed, and from what). An unfinished last line (the agent killed while writing it) announced
        a grant that was never made: it is left out, and the next change rewrites the ledger whole."""
        raw = self._read(self.GRANTS)
        self._grant_lines, self._grant_damaged = 0, False
        if raw is None:
            return set()
        grants: Grants = set()
        expected: int | None = None
        *lines, tail = raw.split(b"\n")
        for number, line in enumerate(lines, start=1):
            where = f"{self.grants_path}, line {number}"
            data = _parse_json(self.grants_path, line)
            if not isinstance(data, dict) or data.get("kind") != GRANT_LEDGER:
                raise StateFileIgnored(f"{where}: not a grant ledger's")
            if not _signed_by(data, secret):
                raise StateFileIgnored(f"{where}: bad or missing signature")
            seq, op, path, user = (data.get(key) for key in ("seq", "op", "path", "user"))
            if not (isinstance(seq, int) and op in ("+", "-") and isinstance(path, str) and isinstance(user, str)):
                raise StateFileIgnored(f"{where}: malformed")
            if expected is not None and seq != expected:
                raise StateFileIgnored(f"{where}: line {expected} is missing")
            expected = seq + 1
            if op == "+":
                grants.add((path, user))
            else:
                grants.discard((path, user))
        self._grant_seq = expected or 1
        self._grant_lines = len(lines)
        self._grant_damaged = bool(tail)  # appending after a torn line would glue the next one to it
        return grants

    def append_grants(self, op: str, entries: Grants, *, current: Grants, secret: str) -> None:
        """Add lines for ``entries`` given ("+") or taken back ("-"); ``current`` is the whole ledger after the
        change, written in their place (``rewrite_grants``) when the journal cannot take an append: its last line
        was torn, or an earlier write failed (a line missing in between would make the whole ledger untrusted).
        Not synced to the disk: the ledger matters until the machine stops, and ACLs on /dev do not survive a
        reboot. A failure raises OSError and leaves the next change to rewrite the ledger."""
        if not entries:
            return
        if self._grant_damaged:
            self.rewrite_grants(current, secret=secret)
            return
        lines = _grant_lines(self._grant_seq, op, entries, secret)
        try:
            if self._grant_fd is None:
                self._grant_fd = self._open_for_appending(self.GRANTS)
            data = "".join(lines).encode()
            while data:  # a short write is finished, never left half a line
                data = data[os.write(self._grant_fd, data) :]
        except OSError:
            self._grant_damaged = True
            raise
        self._grant_seq += len(lines)
        self._grant_lines += len(lines)

    def rewrite_grants(self, entries: Grants, *, secret: str) -> None:
        """Replace the ledger with one line per entry (atomically: a failure leaves the old ledger, and the next
        change rewrites it again)."""
        lines = _grant_lines(1, "+", entries, secret)
        try:
            self._write_atomically(self.GRANTS, lambda file: file.writelines(lines), durable=False)
        except OSError:
            self._grant_damaged = True
            raise
        self._close_grants()  # its descriptor names the file just replaced
        self._grant_seq, self._grant_lines, self._grant_damaged = 1 + len(lines), len(lines), False

    @property
    def grant_lines(self) -> int:
        """How many lines the ledger has, as this process last read or wrote it."""
        return self._grant_lines

    def _open_for_appending(self, name: str) -> int:
        """``name`` in STATE_DIR, made if missing, opened to append to: never through a link, and only a regular
        file of the agent's own (O_NONBLOCK: a FIFO planted under the name fails at once instead of hanging)."""
        directory = self._open_directory(create=True)
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(name, flags, 0o600, dir_fd=directory)
        finally:
            os.close(directory)
        problem = _not_the_agents_own(self.directory / name, os.fstat(fd))
        if problem:
            os.close(fd)
            raise OSError(errno.EPERM, problem)
        return fd

    def _close_grants(self) -> None:
        if self._grant_fd is not None:
            os.close(self._grant_fd)
            self._grant_fd = None

    # -- files in the directory, never through a link ----------------------------------------------

    def _open_directory(self, *, create: bool) -> int:
        """A descriptor of STATE_DIR, checked (the caller closes it); FileNotFoundError if it does not
        exist and ``create`` is false."""
        if create:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _check_directory(self.directory, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read(self, name: str) -> bytes | None:
        """The file's bytes, None if it does not exist; StateFileIgnored for anything else wrong."""
        path = self.directory / name
        try:
            directory = self._open_directory(create=False)
        except FileNotFoundError:
            return None
        except OSError as error:  # UnsafeStateDir included
            raise StateFileIgnored(f"{path}: {error}") from error
        try:
            # O_NONBLOCK: a FIFO planted under the name must not hang the agent at start.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise StateFileIgnored(f"{path} is a symbolic link: not followed") from error
            raise StateFileIgnored(f"{path}: {error.strerror}") from error
        finally:
            os.close(directory)
        problem = _not_the_agents_own(path, os.fstat(fd))
        if problem:
            os.close(fd)
            raise StateFileIgnored(problem)
        with os.fdopen(fd, "rb") as file:
            try:
                raw = file.read(MAX_STATE_FILE_BYTES + 1)
            except OSError as error:
                raise StateFileIgnored(f"{path}: {error.strerror}") from error
        if len(raw) > MAX_STATE_FILE_BYTES:
            raise StateFileIgnored(f"{path} is larger than {MAX_STATE_FILE_BYTES} bytes")
        return raw

    def _write(self, name: str, data: Any) -> None:
        self._write_atomically(name, lambda file: json.dump(data, file, sort_keys=True))

    def _write_atomically(self, name: str, fill: Callable[[TextIO], object], *, durable: bool = True) -> None:
        """Replace ``name`` with what ``fill`` writes into a new file: all of it, or (after any failure) nothing."""
        directory = self._open_directory(create=True)
        try:
            temporary = self._temporary_name(name)
            # O_EXCL with O_CREAT never follows a link (an existing name fails); O_NOFOLLOW says so twice.
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temporary, flags, 0o600, dir_fd=directory)
            try:
                with os.fdopen(fd, "w") as file:
                    fill(file)
                    file.flush()
                    if durable:
                        os.fsync(file.fileno())
                # A rename replaces whatever has the name (a link included) and never writes through it.
                os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=directory)
                raise
            if durable:
                os.fsync(directory)
        finally:
            os.close(directory)

    @staticmethod
    def _temporary_name(name: str) -> str:
        return f".{Path(name).stem}-{secrets.token_hex(8)}.tmp"


def _grant_lines(first: int, op: str, entries: Grants, secret: str) -> list[str]:
    """The ledger's signed lines for ``entries``, numbered from ``first`` in a stable order."""
    lines = []
    for seq, (path, user) in enumerate(sorted(entries), start=first):
        record = {"kind": GRANT_LEDGER, "seq": seq, "op": op, "path": path, "user": user}
        lines.append(json.dumps(signing.signed(record, secret), sort_keys=True) + "\n")
    return lines


def _signed_by(data: dict[str, Any], secret: str) -> bool:
    try:
        return signing.verify(data, secret)
    except (TypeError, ValueError):  # a signature that is not text hmac can compare
        return False


def _not_the_agents_own(path: str | Path, info: os.stat_result) -> str | None:
    """Why a state file the agent opened is not one it can vouch for: not a regular file, someone else's, or
    writable by others (the agent writes 0600); None when it is its own."""
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file"
    if info.st_uid != os.geteuid():
        return f"{path} belongs to {_account(info.st_uid)}, not to the agent"
    if info.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _parse_json(path: Path, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:  # RecursionError: JSON nested too deep
        raise StateFileIgnored(f"{path}: not valid JSON ({str(error)[:100]})") from error


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
