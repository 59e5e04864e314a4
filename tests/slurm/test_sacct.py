"""Reading job accounting with ``sacct`` (issue 23, GPU-hours used in each booking's reservation; slurm/sacct.py):
against a real one-node cluster with slurmdbd (tests/slurm/cluster.py, ``accounting=True``) and on output recorded
from Slurm 22.05.8 on Debian 12 (tests/slurm/fixtures/sacct/, its README says how)."""

# The tests run fixed argument lists (never a shell) as the cluster's throwaway accounts.

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from slurm.controller import SlurmJob
from slurm.sacct import AccountingOff, Sacct, gpus_from
from slurm.scontrol import SlurmError
from tests.slurm.cluster import LocalSlurm

RECORDED = Path(__file__).parent / "fixtures" / "sacct"
POLL_SECONDS = 20  # jobs reach slurmdbd after they end, asynchronously


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def second(moment: datetime) -> datetime:
    """sacct's times are whole seconds."""
    return moment.replace(microsecond=0)


def poll(read: Callable[[], list[SlurmJob]], done: Callable[[list[SlurmJob]], bool]) -> list[SlurmJob]:
    deadline = time.monotonic() + POLL_SECONDS
    while True:
        jobs = read()
        if done(jobs) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.3)


# --- the real cluster ----------------------------------------------------------------------------------------------


@pytest.fixture
def cluster(slurm_accounting_cluster: LocalSlurm) -> Iterator[LocalSlurm]:
    yield slurm_accounting_cluster
    for line in slurm_accounting_cluster.scontrol("show", "reservation", "-o", check=False).splitlines():
        if line.startswith("ReservationName="):
            slurm_accounting_cluster.scontrol("delete", line.split()[0], check=False)


@pytest.fixture
def sacct(cluster: LocalSlurm) -> Sacct:
    return Sacct(shlex.split(cluster.sacct_setting))


def test_it_reads_who_ran_jobs_in_which_reservation_on_how_many_gpus_and_when(cluster, sacct, slurm_accounts):
    holder, other = slurm_accounts
    began = second(datetime.now(UTC))
    outside = cluster.srun(other, "--gres=gpu:1", "-t", "1", "true")
    assert outside.returncode == 0, outside.stderr  # accepted with no association in the accounting database
    name = f"gpubook-sacct-{secrets.token_hex(3)}"
    cluster.scontrol(
        "create", "reservation", f"ReservationName={name}", f"Users={holder}", f"Nodes={cluster.node}",
        "StartTime=now", "Duration=10",
    )  # fmt: skip
    inside = cluster.srun(holder, f"--reservation={name}", "--gres=gpu:2", "-t", "1", "sleep", "2")
    assert inside.returncode == 0, inside.stderr
    ended = datetime.now(UTC)

    def these() -> list[SlurmJob]:  # not another test's job that ran into this second
        return [job for job in sacct.jobs(start=began, end=ended + timedelta(seconds=1)) if job.start >= began]

    jobs = poll(these, lambda jobs: len(jobs) == 2 and all(job.end for job in jobs))

    by_user = {job.user: job for job in jobs}
    assert sorted(by_user) == sorted([holder, other]), jobs
    mine, theirs = by_user[holder], by_user[other]
    assert (mine.reservation, mine.gpus, mine.nodes) == (name, 2, cluster.node)
    assert (theirs.reservation, theirs.gpus) == ("", 1)
    for job in jobs:
        assert job.start.tzinfo == UTC and job.end is not None and job.end.tzinfo == UTC
        assert began <= job.start <= job.end <= ended
    assert mine.end is not None and mine.end - mine.start >= timedelta(seconds=2)
    assert theirs.end is not None and theirs.end <= mine.start
    # A window after them finds neither.
    assert sacct.jobs(start=ended + timedelta(seconds=2), end=ended + timedelta(minutes=1)) == []


def test_a_running_job_has_no_end(cluster, sacct, slurm_accounts):
    began = second(datetime.now(UTC))
    job_id = cluster.sbatch(slurm_accounts[0], "--gres=gpu:1", "-t", "1", "--wrap", "sleep 60")
    try:
        jobs = poll(
            lambda: sacct.jobs(start=began, end=datetime.now(UTC) + timedelta(minutes=1)),
            lambda jobs: any(job.job_id == job_id for job in jobs),
        )
        [running] = [job for job in jobs if job.job_id == job_id]
        assert running.end is None and running.start >= began and running.gpus == 1
        assert running.user == slurm_accounts[0]
    finally:
        cluster.scancel(job_id)


def test_a_cluster_without_accounting_says_accounting_is_off(slurm_cluster):
    with pytest.raises(AccountingOff) as raised:
        Sacct(shlex.split(slurm_cluster.sacct_setting)).jobs(start=datetime.now(UTC), end=datetime.now(UTC))
    assert str(raised.value) == "Slurm accounting storage is disabled"


def test_a_command_that_is_not_there_is_a_slurm_error():
    with pytest.raises(SlurmError, match="/nonexistent/sacct is not installed here") as raised:
        Sacct(["/nonexistent/sacct"]).jobs(start=datetime.now(UTC), end=datetime.now(UTC))
    assert not isinstance(raised.value, AccountingOff)


# --- recorded output -----------------------------------------------------------------------------------------------


def answering(tmp_path: Path, name: str, *, status: int = 0) -> list[str]:
    """A command that answers as sacct did (a recorded file: on stdout, or on stderr with ``status``) and writes
    the arguments it was given, one a line, with TZ and SLURM_TIME_FORMAT, to tmp_path/arguments."""
    stream = ">&2" if status else ""
    script = (
        f'printf "%s\\n" "$0" "$@" "TZ=$TZ" "SLURM_TIME_FORMAT=$SLURM_TIME_FORMAT" >> {tmp_path}/arguments; '
        f"cat {RECORDED / name} {stream}; exit {status}"
    )
    return ["/bin/sh", "-c", script]


WHOLE_DAY = {"start": at("2026-12-06T00:00:00"), "end": at("2026-12-07T00:00:00")}


def test_recorded_jobs_are_read_with_their_reservation_gpus_and_times(tmp_path):
    jobs = Sacct(answering(tmp_path, "jobs.txt")).jobs(**WHOLE_DAY)

    # 5 (pending) and 6 (cancelled before it started) never ran; 2 started in its reservation's first second, when
    # sacct gives its id and no name: the other jobs of that id name it.
    assert jobs == [
        SlurmJob("1", "gpbs_try1", "", at("2026-12-06T09:16:44"), at("2026-12-06T09:16:44"), 0, "vm"),
        SlurmJob("2", "gpbs_try1", "gpubook-41", at("2026-12-06T09:16:44"), at("2026-12-06T09:16:46"), 2, "vm"),
        SlurmJob("3", "gpbs_try1", "gpubook-41", at("2026-12-06T09:16:48"), at("2026-12-06T09:16:48"), 1, "vm"),
        SlurmJob("4", "gpbs_try1", "gpubook-41", at("2026-12-06T09:16:50"), None, 1, "vm"),
    ]


def test_it_asks_for_every_users_allocations_in_the_window_in_utc(tmp_path):
    paris = timezone(timedelta(hours=1))
    Sacct(answering(tmp_path, "jobs.txt")).jobs(
        start=datetime(2026, 12, 6, 10, 0, tzinfo=paris), end=datetime(2026, 12, 6, 11, 30, tzinfo=paris)
    )

    assert (tmp_path / "arguments").read_text().splitlines() == [
        "--allusers", "--allocations", "--parsable2", "--noheader",
        "--format=JobID,User,Reservation,ReservationId,Start,End,AllocTRES,NodeList,State",
        "--starttime=2026-12-06T09:00:00", "--endtime=2026-12-06T10:30:00", "TZ=UTC", "SLURM_TIME_FORMAT=standard",
    ]  # fmt: skip


def test_typed_gpus_are_not_counted_twice(tmp_path):
    jobs = Sacct(answering(tmp_path, "jobs-typed-tres.txt")).jobs(**WHOLE_DAY)

    assert [(job.job_id, job.gpus) for job in jobs] == [("1", 0), ("2", 2), ("3", 1), ("4", 1)]
    assert gpus_from("billing=1,cpu=1,gres/gpu:a100=2,gres/gpu:h100=1,node=1") == 3  # typed only: summed
    assert gpus_from("") == 0


def test_only_jobs_that_ran_in_the_window_are_kept(tmp_path):
    sacct = Sacct(answering(tmp_path, "jobs.txt"))

    # [09:16:45, 09:16:48): 2 was running; 1 ended before; 3 started at its end; 4 still runs but started later.
    jobs = sacct.jobs(start=at("2026-12-06T09:16:45"), end=at("2026-12-06T09:16:48"))
    assert [job.job_id for job in jobs] == ["2"]
    later = sacct.jobs(start=at("2026-12-06T10:00:00"), end=at("2026-12-06T11:00:00"))
    assert [job.job_id for job in later] == ["4"]  # running: still in use


def test_a_reservation_sacct_names_only_by_id_is_named_by_sacctmgr(tmp_path):
    sacctmgr = answering(tmp_path, "sacctmgr-reservations.txt")
    sacct = Sacct(answering(tmp_path, "jobs.txt"), sacctmgr=sacctmgr)

    # Only job 2 (and job 1, in no reservation) in this window: no other job names reservation 1.
    jobs = sacct.jobs(start=at("2026-12-06T09:16:44"), end=at("2026-12-06T09:16:47"))

    assert [(job.job_id, job.reservation) for job in jobs] == [("1", ""), ("2", "gpubook-41")]
    asked = (tmp_path / "arguments").read_text().splitlines()
    assert asked[asked.index("show") :] == [
        "show", "reservation", "--parsable2", "--noheader", "ids=1", "start=2026-12-06T09:16:44",
        "end=2026-12-06T09:16:45", "format=ID,Name", "TZ=UTC", "SLURM_TIME_FORMAT=standard",
    ]  # fmt: skip


def test_sacctmgr_is_the_sacct_command_with_sacctmgr_for_sacct():
    assert Sacct(["env", "SLURM_CONF=/x/slurm.conf", "sacct"]).sacctmgr == [
        "env",
        "SLURM_CONF=/x/slurm.conf",
        "sacctmgr",
    ]
    assert Sacct(["ssh", "--", "ctl", "/usr/bin/sacct"]).sacctmgr == ["ssh", "--", "ctl", "/usr/bin/sacctmgr"]
    assert Sacct(["/opt/site/accounting-wrapper"]).sacctmgr is None


def test_without_sacctmgr_such_a_job_has_no_reservation_name(tmp_path):
    sacct = Sacct(answering(tmp_path, "jobs.txt"))
    sacct.sacctmgr = None

    jobs = sacct.jobs(start=at("2026-12-06T09:16:44"), end=at("2026-12-06T09:16:47"))

    assert [(job.job_id, job.reservation) for job in jobs] == [("1", ""), ("2", "")]


def test_accounting_off_is_its_own_error_in_sacct_and_sacctmgr_words(tmp_path):
    with pytest.raises(AccountingOff) as raised:
        Sacct(answering(tmp_path, "accounting-off.stderr", status=1)).jobs(**WHOLE_DAY)
    assert str(raised.value) == "Slurm accounting storage is disabled"

    sacct = Sacct(
        answering(tmp_path, "jobs.txt"), sacctmgr=answering(tmp_path, "sacctmgr-accounting-off.stderr", status=1)
    )
    with pytest.raises(AccountingOff, match="Only 'accounting_storage/slurmdbd' is supported"):
        sacct.jobs(start=at("2026-12-06T09:16:44"), end=at("2026-12-06T09:16:47"))


def test_slurmdbd_out_of_reach_is_a_slurm_error_in_its_words_not_accounting_off(tmp_path):
    with pytest.raises(SlurmError) as raised:
        Sacct(answering(tmp_path, "slurmdbd-down.stderr", status=1)).jobs(**WHOLE_DAY)
    assert str(raised.value) == "sacct: error: Problem talking to the database: Connection refused"
    assert not isinstance(raised.value, AccountingOff)


def test_output_it_cannot_read_and_no_answer_are_slurm_errors(tmp_path):
    (tmp_path / "odd.txt").write_text("1|gpbs_try1|2026-12-06T09:16:44\n")
    with pytest.raises(SlurmError, match="a line of 3 fields, not 9"):
        Sacct(["/bin/sh", "-c", f"cat {tmp_path / 'odd.txt'}"]).jobs(**WHOLE_DAY)

    with pytest.raises(SlurmError, match="did not answer within 1 s"):
        Sacct(["/bin/sh", "-c", "sleep 5"], timeout=1).jobs(**WHOLE_DAY)


def test_names_come_back_as_data_and_only_reservation_ids_are_sent_to_sacctmgr(tmp_path):
    (tmp_path / "odd.txt").write_text(
        "7|$(id)|a b;c|3|2026-12-06T09:16:44|2026-12-06T09:16:46|gres/gpu=1|vm|COMPLETED\n"
        "8|x||3;id|2026-12-06T09:16:44|2026-12-06T09:16:46|gres/gpu=1|vm|COMPLETED\n"
    )
    refusing = ["/bin/sh", "-c", "exit 3"]  # sacctmgr: never asked (3;id is no reservation id)
    jobs = Sacct(["/bin/sh", "-c", f"cat {tmp_path / 'odd.txt'}"], sacctmgr=refusing).jobs(**WHOLE_DAY)

    assert [(job.user, job.reservation) for job in jobs] == [("$(id)", "a b;c"), ("x", "")]
