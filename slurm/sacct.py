"""Reading a Slurm cluster's job accounting through ``sacct`` (issue 23): which jobs ran in a period, whose, in which
reservation and on how many GPUs, for the GPU-hours used in each booking's reservation.

The command is an argument list (``sacct``, ``env SLURM_CONF=/etc/slurm/slurm.conf sacct`` or
``ssh -- slurm-ctl sacct``): every call appends its own arguments, never through a shell. It runs with ``TZ=UTC``
and ``SLURM_TIME_FORMAT=standard``, so a local ``sacct`` writes its times as UTC ISO 8601 whatever this host's zone;
one run over ``ssh`` writes them in the remote host's zone, which must be UTC, as for ``scontrol`` (slurm_time).

A cluster without slurmdbd has no accounting: sacct answers ``Slurm accounting storage is disabled`` (22.05; older
releases write ``SLURM``) and sacctmgr ``You are not running a supported accounting_storage plugin``: AccountingOff,
not a failure to reach it (slurmdbd down is ``Problem talking to the database: Connection refused``, a SlurmError).

sacct names a job's reservation by joining the job to the reservation's record with ``reservation start < job
start`` (src/plugins/accounting_storage/mysql/as_mysql_jobacct_process.c, 22.05): a job that starts in the
reservation's first second (a job queued for a booking, started the moment it begins) comes back with the
reservation's id and no name. Those names are looked up by id: from the other jobs of the answer, else with
``sacctmgr show reservation`` (the same command, ``sacctmgr`` for ``sacct``).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from slurm.controller import SlurmJob
from slurm.scontrol import SlurmError, slurm_time, slurm_timestamp

TIMEOUT_SECONDS = 30.0
# The 22.05 names of the fields (``sacct --helpformat``), in the order they are parsed.
FIELDS = ("JobID", "User", "Reservation", "ReservationId", "Start", "End", "AllocTRES", "NodeList", "State")
# The time fields of a job that has not started (Unknown: pending; None: cancelled before it started) or not ended.
NO_TIME = frozenset({"", "Unknown", "None"})
# sacct's words, then sacctmgr's (its last line: "Only 'accounting_storage/slurmdbd' is supported.").
ACCOUNTING_OFF_RE = re.compile(
    r"accounting storage is disabled|not running a supported accounting_storage plugin", re.IGNORECASE
)
RESERVATION_ID_RE = re.compile(r"\A[1-9][0-9]{0,9}\Z")


class AccountingOff(SlurmError):
    """The cluster keeps no job accounting (no slurmdbd): sacct answers, there is nothing to ask it."""


@dataclass(frozen=True)
class _Row:
    job: SlurmJob
    reservation_id: str  # "" or "0" when the job ran in no reservation


class Sacct:
    """``sacct`` as configured: ``command`` is the argument list that runs it. ``sacctmgr``, the one that runs
    sacctmgr (for reservation names sacct leaves out), is the same list with ``sacctmgr`` for ``sacct`` unless
    given; None when the command does not end in ``sacct``, and then such a job's reservation stays ""."""

    def __init__(
        self, command: Sequence[str], timeout: float = TIMEOUT_SECONDS, *, sacctmgr: Sequence[str] | None = None
    ) -> None:
        self.command = list(command)
        self.timeout = timeout
        if sacctmgr is not None:
            self.sacctmgr: list[str] | None = list(sacctmgr)
        elif self.command and os.path.basename(self.command[-1]) == "sacct":
            self.sacctmgr = [*self.command[:-1], f"{self.command[-1]}mgr"]
        else:
            self.sacctmgr = None

    def jobs(self, *, start: datetime, end: datetime) -> list[SlurmJob]:
        """Every user's jobs (allocations, not their steps) that ran at some time in [start, end); jobs that have
        not started are left out, one still running has ``end`` None."""
        output = self._run(
            self.command,
            "--allusers", "--allocations", "--parsable2", "--noheader", f"--format={','.join(FIELDS)}",
            f"--starttime={slurm_timestamp(start)}", f"--endtime={slurm_timestamp(end)}",
        )  # fmt: skip
        rows = [row for row in parse_rows(output) if _ran_within(row.job, start, end)]
        return [row.job for row in self._named(rows)]

    def _named(self, rows: list[_Row]) -> list[_Row]:
        """The rows, with the names of the reservations sacct gave only by id."""
        unnamed = [row for row in rows if not row.job.reservation and RESERVATION_ID_RE.match(row.reservation_id)]
        known = {row.reservation_id: row.job.reservation for row in rows if row.job.reservation}
        missing = sorted({row.reservation_id for row in unnamed} - known.keys(), key=int)
        if missing and self.sacctmgr is not None:
            output = self._run(
                self.sacctmgr,
                "show", "reservation", "--parsable2", "--noheader", f"ids={','.join(missing)}",
                f"start={slurm_timestamp(min(row.job.start for row in unnamed))}",
                f"end={slurm_timestamp(max(row.job.start for row in unnamed) + timedelta(seconds=1))}",
                "format=ID,Name",
            )  # fmt: skip
            for line in output.splitlines():
                reservation_id, _, name = line.rstrip("|").partition("|")
                if reservation_id in missing and name:
                    known[reservation_id] = name  # an id is one reservation's, across its changes
        return [
            _Row(replace(row.job, reservation=known.get(row.reservation_id, "")), row.reservation_id)
            if not row.job.reservation
            else row
            for row in rows
        ]

    def _run(self, command: Sequence[str], *arguments: str) -> str:
        environment = {**os.environ, "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
        try:
            done = subprocess.run(  # noqa: S603 - an argument list from the settings, then our own arguments
                [*command, *arguments],
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
                env=environment,
            )
        except FileNotFoundError:
            raise SlurmError(f"{command[0]} is not installed here") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"Slurm's accounting did not answer within {self.timeout:.0f} s") from None
        if done.returncode != 0:
            text = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
            said = text.splitlines()[-1][:500]
            if ACCOUNTING_OFF_RE.search(text):
                raise AccountingOff(said)
            raise SlurmError(said)
        return done.stdout


def parse_rows(text: str) -> list[_Row]:
    """``sacct --parsable2 --noheader`` lines of FIELDS; jobs that have not started are left out."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(FIELDS):
            raise SlurmError(f"sacct answered a line of {len(values)} fields, not {len(FIELDS)}: {line[:200]!r}")
        record = dict(zip(FIELDS, values, strict=True))
        if record["Start"] in NO_TIME:
            continue
        job = SlurmJob(
            job_id=record["JobID"],
            user=record["User"],
            reservation=record["Reservation"],
            start=_time(record["Start"], line),
            end=None if record["End"] in NO_TIME or record["State"] == "RUNNING" else _time(record["End"], line),
            gpus=gpus_from(record["AllocTRES"]),
            nodes="" if record["NodeList"] == "None assigned" else record["NodeList"],
        )
        rows.append(_Row(job, record["ReservationId"]))
    return rows


def gpus_from(tres: str) -> int:
    """GPUs in an AllocTRES (``billing=1,cpu=1,gres/gpu=2,node=1``). A cluster that also tracks typed GPUs
    (``gres/gpu:a100=2``) counts them again under those names: only ``gres/gpu`` is counted, or the typed ones when
    it is not there."""
    counts = dict(item.partition("=")[::2] for item in tres.split(",") if "=" in item)
    if counts.get("gres/gpu", "").isdigit():
        return int(counts["gres/gpu"])
    return sum(int(count) for name, count in counts.items() if name.startswith("gres/gpu:") and count.isdigit())


def _time(text: str, line: str) -> datetime:
    try:
        return slurm_time(text)
    except ValueError:
        raise SlurmError(f"sacct answered a time that is not one: {line[:200]!r}") from None


def _ran_within(job: SlurmJob, start: datetime, end: datetime) -> bool:
    """Whether the job ran at some time in [start, end); one that took no time counts where it started."""
    if job.start >= end:
        return False
    return job.start >= start or job.end is None or job.end > start
