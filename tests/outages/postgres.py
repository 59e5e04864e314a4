"""A PostgreSQL cluster of the test's own, for the tests that stop and restart the database under traffic.

The shared server on 5432 carries every other test run on this machine: a test that restarts a database
restarts its own. ``LocalPostgres`` runs Debian's initdb and pg_ctl of the newest PostgreSQL installed (as the
``postgres`` user when the tests run as root, since PostgreSQL refuses root) in a directory under /tmp, on a free
port of 127.0.0.1, trusting local connections; it makes one database, ``portal``. Where it cannot, the test fails
and says why: scripts/services installs PostgreSQL, so a skip would only hide that the outage went untested.
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.agent.harness import free_port, wait_for

INSTALLED = Path("/usr/lib/postgresql")  # Debian's: one <major version>/bin per installed server
PROGRAMS = ("initdb", "pg_ctl", "createdb")


def server_bin() -> Path | None:
    """The bin directory of the newest PostgreSQL installed that has every program the cluster needs, or None."""
    complete = [
        path.parent
        for path in INSTALLED.glob("*/bin")
        if all((path / program).is_file() for program in PROGRAMS) and _version(path.parent.name) is not None
    ]
    newest = max(complete, key=lambda home: _version(home.name) or (), default=None)
    return None if newest is None else newest / "bin"


def _version(name: str) -> tuple[int, ...] | None:
    """``"16"`` -> (16,), ``"9.6"`` -> (9, 6); None for a name that is no version."""
    parts = name.split(".")
    return tuple(int(part) for part in parts) if all(part.isdigit() for part in parts) else None


def _cannot_run(bin_dir: Path | None) -> str | None:
    """Why no cluster of the test's own can run here, or None."""
    if bin_dir is None:
        wanted = " and ".join(PROGRAMS)
        return f"no {INSTALLED}/<version>/bin with {wanted}: install PostgreSQL (scripts/services does)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a postgres user to run the cluster as (PostgreSQL refuses root)"
    return None


class LocalPostgres:
    def __init__(self) -> None:
        bin_dir = server_bin()
        reason = _cannot_run(bin_dir)
        if reason is not None or bin_dir is None:
            pytest.fail(f"this test needs a PostgreSQL cluster of its own: {reason}", pytrace=False)
        self.bin = bin_dir
        self.home = Path(tempfile.mkdtemp(prefix="gpbt-pg-", dir="/tmp"))
        self.data = self.home / "data"
        self.port = free_port()
        self.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self.user is not None:
            os.chown(self.home, self.user.pw_uid, self.user.pw_gid)
        self._run(self.bin / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        self.start()
        self._run(self.bin / "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "portal")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/portal"

    def _run(self, *command: Any, check: bool = True) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {"user": self.user.pw_uid, "group": self.user.pw_gid} if self.user else {}
        return subprocess.run(
            [str(part) for part in command],
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
            **kwargs,
        )

    def _pg_ctl(self, *arguments: str) -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.home / "server.log", "-w", "-t", "60", *arguments)

    def start(self) -> None:
        # Durability is not what these tests look at: no fsync keeps a slow machine's restarts short.
        options = f"-p {self.port} -k {self.home} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        self._pg_ctl("-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m fast``: open sessions are ended, the server stops and starts again."""
        self._pg_ctl("-m", mode, "restart")

    def answers(self) -> bool:
        """Whether the database takes a new connection and a query now."""
        try:
            with psycopg.connect(self.url, connect_timeout=1) as connection:
                connection.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def wait_until_answering(self, timeout: float = 60) -> float:
        """The monotonic time the database first answered."""
        answered = wait_for(self.answers, timeout=timeout, interval=0.02)
        if answered is None:
            raise RuntimeError(f"the test's PostgreSQL did not come back:\n{self.log()}")
        return answered

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, connect_timeout=5) as connection:
            return connection.execute(sql, params).fetchall()

    def log(self) -> str:
        path = self.home / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.home, ignore_errors=True)
