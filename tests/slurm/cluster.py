"""A real one-node Slurm cluster for the tests (issue 23): Debian's munge, slurmctld and slurmd, started as root in
a directory of their own, on free ports, with four stand-in GPUs as GRES (placeholder files; Slurm only counts
them). Clients reach it through SLURM_CONF, which the portal's SLURM_SCONTROL passes with ``env``.

``LocalSlurm(accounting=True)`` adds job accounting, as a site with ``sacct`` has it: a MariaDB server of its own
(datadir, socket and a free port on 127.0.0.1 in the cluster's directory) and slurmdbd on a free port. Jobs are
accepted without associations (no AccountingStorageEnforce), as on a site that accounts but does not limit.
"""

# The tests run fixed argument lists of the cluster's own programs (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/scontrol", "/usr/bin/srun")
ACCOUNTING = (
    "/usr/sbin/slurmdbd", "/usr/bin/sacct", "/usr/bin/sacctmgr", "/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db",
    "/usr/bin/mariadb",
)  # fmt: skip


def unavailable(*, accounting: bool = False) -> str | None:
    """Why no cluster (with accounting: slurmdbd on MariaDB too) can run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm daemons run as root"
    missing = [path for path in DAEMONS if not os.path.exists(path)]
    if missing:
        return f"{', '.join(missing)} missing: scripts/services installs slurmctld, slurmd, slurm-client and munge"
    missing = [path for path in ACCOUNTING if accounting and not os.path.exists(path)]
    if missing:
        return f"{', '.join(missing)} missing: scripts/services installs slurmdbd and mariadb-server"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalSlurm:
    def __init__(self, gpus: int = 4, gpu_type: str = "a100", *, accounting: bool = False) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="gpbt-slurm-", dir="/tmp"))
        self.home.chmod(0o755)  # users' srun reaches the config and munge's socket
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.home / "slurm.conf"
        self.munge_socket = self.home / "munge" / "munge.socket"
        self.gpus, self.gpu_type = gpus, gpu_type
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.accounting = accounting
        self.dbd_port = free_port() if accounting else 0
        self.mysql_port = free_port() if accounting else 0
        self.mysql: subprocess.Popen[bytes] | None = None

    @property
    def sacct_setting(self) -> str:
        """The command that runs this cluster's ``sacct`` (what SLURM_SCONTROL is to scontrol)."""
        return f"env SLURM_CONF={self.conf} sacct"

    @property
    def scontrol_setting(self) -> str:
        """SLURM_SCONTROL for the portal: scontrol, told where this cluster's configuration is."""
        return f"env SLURM_CONF={self.conf} scontrol"

    def start(self) -> None:
        for sub in ("munge", "state", "spool", "log", "dev", "mysql"):
            (self.home / sub).mkdir()
        (self.home / "munge").chmod(0o755)
        key = self.home / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        for index in range(self.gpus):
            (self.home / "dev" / f"gpu{index}").touch()
        subprocess.run(
            [
                "/usr/sbin/munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--log-file={self.home / 'log' / 'munged.log'}", f"--pid-file={self.home / 'munge' / 'munged.pid'}",
                f"--seed-file={self.home / 'munge' / 'seed'}",
            ],
            check=True,
        )  # fmt: skip
        self.conf.write_text(self._config())
        (self.home / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu Type={self.gpu_type} File={self.home}/dev/gpu[0-{self.gpus - 1}]\n"
        )
        if self.accounting:
            self.start_accounting()
        self.start_controller()
        subprocess.run(["/usr/sbin/slurmd", "-f", str(self.conf)], check=True, env=self.env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = self.scontrol("show", "node", self.node, check=False)
            if "State=IDLE" in state:
                return
            time.sleep(0.2)
        raise AssertionError(f"the node did not come up:\n{state}\n{self.logs()}")

    def start_controller(self) -> None:
        subprocess.run(["/usr/sbin/slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "Slurmctld(primary) at" not in self.scontrol("ping", check=False):
            time.sleep(0.2)

    def start_accounting(self) -> None:
        """MariaDB in the cluster's directory, then slurmdbd on it; the cluster is registered before slurmctld
        first talks to slurmdbd."""
        data = self.home / "mysql" / "data"
        subprocess.run(
            [
                "/usr/bin/mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={data}",
                "--auth-root-authentication-method=socket", "--skip-test-db", "--skip-name-resolve",
            ],
            check=True, capture_output=True,
        )  # fmt: skip
        self.mysql = subprocess.Popen(
            [
                "/usr/sbin/mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
                f"--socket={self.home / 'mysql' / 'mysqld.sock'}", f"--pid-file={self.home / 'mysql' / 'mysqld.pid'}",
                "--bind-address=127.0.0.1", f"--port={self.mysql_port}", "--skip-name-resolve",
                f"--log-error={self.home / 'log' / 'mariadb.log'}",
                # Throwaway data: no durability asked for, which keeps slurmdbd's first CREATE TABLEs quick.
                "--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
                "--innodb-flush-method=nosync", "--skip-log-bin",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        password = secrets.token_hex(12)
        self.sql(
            "CREATE DATABASE slurm_acct_db;"
            f" CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
            " GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';",
            wait=20,
        )
        dbd_conf = self.home / "slurmdbd.conf"
        dbd_conf.touch(mode=0o600)  # slurmdbd refuses a config others may read: it holds the password
        dbd_conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.dbd_port}",
                    "SlurmUser=root",
                    f"PidFile={self.home}/slurmdbd.pid",
                    f"LogFile={self.home}/log/slurmdbd.log",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.mysql_port}",
                    "StorageUser=slurm",
                    f"StoragePass={password}",
                    "StorageLoc=slurm_acct_db",
                    "",
                ]
            )
        )
        subprocess.run(["/usr/sbin/slurmdbd"], check=True, env=self.env)  # slurmdbd.conf: beside SLURM_CONF
        deadline = time.monotonic() + 20
        while True:
            added = self.sacctmgr("-i", "add", "cluster", "gpubooktest")
            if added.returncode == 0 or "already exists" in added.stdout + added.stderr:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"slurmdbd did not come up:\n{added.stdout}{added.stderr}\n{self.logs()}")
            time.sleep(0.2)

    def sql(self, statements: str, *, wait: float = 0) -> str:
        """Statements run as MariaDB's root over the cluster's socket; ``wait``: for the server to come up."""
        deadline = time.monotonic() + wait
        while True:
            done = subprocess.run(
                ["/usr/bin/mariadb", "--no-defaults", f"--socket={self.home / 'mysql' / 'mysqld.sock'}", "-u", "root",
                 "-N", "-e", statements],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            if done.returncode == 0:
                return done.stdout
            if time.monotonic() > deadline:
                raise AssertionError(f"mariadb: {done.stderr}\n{self.logs()}")
            time.sleep(0.1)

    def sacctmgr(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/usr/bin/sacctmgr", *arguments], capture_output=True, text=True, env=self.env, timeout=30, check=False
        )

    def stop_controller(self) -> None:
        pid = int((self.home / "slurmctld.pid").read_text())
        os.kill(pid, 9)
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)

    def stop(self) -> None:
        self.scontrol("shutdown", check=False)
        for pid_file in ("slurmctld.pid", "slurmd.pid", "slurmdbd.pid", "mysql/mysqld.pid", "munge/munged.pid"):
            path = self.home / pid_file
            if path.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(path.read_text().strip()), 9)
        if self.mysql is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.mysql.wait(timeout=10)  # killed above: reaped, so its files can go
        shutil.rmtree(self.home, ignore_errors=True)

    def scontrol(self, *arguments: str, check: bool = True) -> str:
        done = subprocess.run(
            ["/usr/bin/scontrol", *arguments], capture_output=True, text=True, env=self.env, timeout=30, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"scontrol {' '.join(arguments)}: {done.stderr}")
        return done.stdout + done.stderr

    def srun(self, user: str, *arguments: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """``srun`` as ``user`` (a unix account), from /tmp."""
        return subprocess.run(
            ["/usr/bin/srun", *arguments],
            user=user,
            cwd="/tmp",  # noqa: S108 - a directory every account may enter
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(self.conf)},
            timeout=timeout,
            check=False,
        )

    def sbatch(self, user: str, *arguments: str) -> str:
        """A batch job of ``user``'s (a unix account), from /tmp: its id."""
        done = subprocess.run(
            ["/usr/bin/sbatch", "--parsable", "--output=/dev/null", *arguments],
            user=user,
            cwd="/tmp",  # noqa: S108 - a directory every account may enter
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(self.conf)},
            timeout=30,
            check=True,
        )
        return done.stdout.strip().split(";")[0]

    def scancel(self, job_id: str) -> None:
        subprocess.run(["/usr/bin/scancel", job_id], env=self.env, check=False)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted((self.home / "log").glob("*.log"))
        )

    def _accounting_config(self) -> list[str]:
        if not self.accounting:
            return ["AccountingStorageType=accounting_storage/none"]
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.dbd_port}",
            f"AccountingStoragePass={self.munge_socket}",  # for slurmdbd, the munge socket (AuthInfo is not used)
            "AccountingStorageTRES=gres/gpu",
        ]

    def _config(self) -> str:
        home = self.home
        return "\n".join(
            [
                "ClusterName=gpubooktest",
                f"SlurmctldHost={self.node}(127.0.0.1)",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                "AuthType=auth/munge",
                f"AuthInfo=socket={self.munge_socket}",
                "CredType=cred/munge",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"StateSaveLocation={home}/state",
                f"SlurmdSpoolDir={home}/spool",
                f"SlurmctldPidFile={home}/slurmctld.pid",
                f"SlurmdPidFile={home}/slurmd.pid",
                f"SlurmctldLogFile={home}/log/slurmctld.log",
                f"SlurmdLogFile={home}/log/slurmd.log",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "GresTypes=gpu",
                "ReturnToService=2",
                "MpiDefault=none",
                "JobAcctGatherType=jobacct_gather/none",
                *self._accounting_config(),
                f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=1000 "
                f"Gres=gpu:{self.gpu_type}:{self.gpus} State=UNKNOWN",
                "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
