"""The launcher's supervisor (gpubook_agent/launcher.py) with real processes and throwaway accounts: a command
runs as the booking's user in a session of its own, with its limits and a clean environment, its output in a
root-only log; stop ends it and everything it started, a child that left the session and one that ignores
SIGTERM included; root, system accounts and malformed launches are refused before anything runs."""

from __future__ import annotations

import os
import pwd
import stat
import time

import pytest

from gpubook_agent import launcher
from gpubook_agent.launcher import LaunchRefused, LaunchSpec, Supervisor, family
from tests.agent.harness import wait_for


@pytest.fixture
def supervisor(tmp_path, unix_users) -> Supervisor:
    log_dir = tmp_path / "launches"
    log_dir.mkdir(mode=0o700)
    return Supervisor(log_dir=str(log_dir), uid_min=1000)


def spec(user, *argv: str, **fields) -> LaunchSpec:
    return LaunchSpec(name=fields.pop("name", "gpubook-7-1"), user=user.name, argv=argv, **fields)


def finished(supervisor: Supervisor, name: str = "gpubook-7-1"):
    assert wait_for(lambda: supervisor.poll() or supervisor._launches[name].exit_code is not None, timeout=10)
    return supervisor._launches[name]


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the name: state, ppid, pgrp, session, ...; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(") ", 1)[1].split()
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def test_the_command_runs_as_the_user_with_its_limits_and_a_clean_environment(supervisor, unix_users):
    user = unix_users[0]
    script = 'id -u; id -g; echo "$CUDA_VISIBLE_DEVICES|$HOME|$USER|$SECRET"; pwd; cat /proc/self/limits'
    os.environ["SECRET"] = "the agent's own"  # never handed on
    try:
        supervisor.start(
            spec(
                user, "/bin/sh", "-c", script,
                env={"CUDA_VISIBLE_DEVICES": "GPU-abc"}, memory_max_bytes=2**30, max_processes=50, open_files=64,
            )
        )  # fmt: skip
    finally:
        del os.environ["SECRET"]
    launch = finished(supervisor)
    assert launch.exit_code == 0 and not launch.stopped
    lines = supervisor.tail("gpubook-7-1").splitlines()
    assert lines[:2] == [str(user.uid), str(user.gid)]
    assert lines[2] == f"GPU-abc|/home/{user.name}|{user.name}|"  # no home on disk: HOME as passwd says, cwd /
    assert lines[3] == "/"
    limits = {line[:26].strip(): line[26:].split()[:2] for line in lines[5:]}  # name: soft, hard
    assert limits["Max address space"] == [str(2**30)] * 2
    assert (limits["Max processes"], limits["Max open files"]) == (["50", "50"], ["64", "64"])
    log = os.stat(launch.log_path)
    assert (log.st_uid, stat.S_IMODE(log.st_mode)) == (0, 0o600)  # the user writes only through its descriptor


def test_it_runs_in_a_session_of_its_own_and_its_exit_code_is_reported_once(supervisor, unix_users):
    launch = supervisor.start(spec(unix_users[0], "/bin/sh", "-c", "sleep 0.5; exit 3"))
    assert stat_fields(launch.pid)[3] == str(launch.pid)  # the leader of its own session
    assert finished(supervisor).exit_code == 3
    assert supervisor.poll() == []


def test_stop_ends_the_whole_family_within_the_grace_even_a_child_that_left_the_session(supervisor, unix_users):
    script = "sleep 300 & setsid sleep 301 & trap '' TERM; while :; do sleep 1; done"
    launch = supervisor.start(spec(unix_users[0], "/bin/sh", "-c", script))
    assert wait_for(lambda: len(family(launch.pid)) >= 4, timeout=5)  # sh, two sleeps, the loop's sleep
    members = family(launch.pid)

    began = time.monotonic()
    stopped = supervisor.stop("gpubook-7-1", grace=1.0)

    assert stopped is not None and stopped.stopped and stopped.unkillable == []
    assert time.monotonic() - began < 1.0 + 5  # the grace, then SIGKILL for the shell that ignores SIGTERM
    assert not any(alive(pid) for pid in members)
    assert stopped.exit_code == -9  # the shell ignored SIGTERM


def test_a_second_start_of_a_running_launch_is_refused(supervisor, unix_users):
    supervisor.start(spec(unix_users[0], "/bin/sleep", "30"))
    with pytest.raises(LaunchRefused, match="runs already"):
        supervisor.start(spec(unix_users[0], "/bin/sleep", "30"))
    supervisor.stop("gpubook-7-1", grace=1.0)


@pytest.mark.parametrize(
    ("user", "argv", "fields", "words"),
    [
        ("root", ("/bin/true",), {}, "not an ordinary account"),
        ("daemon", ("/bin/true",), {}, "not an ordinary account"),
        ("gpbt_nobody_here", ("/bin/true",), {}, "no account"),
        ("Root;rm", ("/bin/true",), {}, "bad username"),
        (None, (), {}, "a list of 1 to 64 arguments"),
        (None, ("/bin/true", "a\0b"), {}, "without NUL"),
        (None, ("/bin/true",), {"name": "../../etc/passwd"}, "bad launch name"),
        (None, ("/bin/true",), {"env": {"LD_PRELOAD=x": "y"}}, "bad environment variable"),
        (None, ("/bin/true",), {"memory_max_bytes": -1}, "positive whole numbers"),
        (None, ("/nonexistent/command",), {}, "could not be started"),
    ],
)
def test_what_may_not_run_is_refused_before_anything_runs(supervisor, unix_users, user, argv, fields, words):
    name = fields.pop("name", "gpubook-7-1")
    launch = LaunchSpec(name=name, user=user or unix_users[0].name, argv=argv, **fields)
    with pytest.raises(LaunchRefused, match=words):
        supervisor.start(launch)
    assert supervisor.poll() == [] and os.listdir(supervisor.log_dir) == []  # no log, anywhere else either


def test_after_the_command_exited_stop_ends_what_is_left_of_its_session_and_nothing_by_its_old_pid(
    supervisor, unix_users
):
    launch = supervisor.start(spec(unix_users[0], "/bin/sh", "-c", "sleep 300 & exit 0"))
    assert finished(supervisor).exit_code == 0
    (orphan,) = [pid for pid in family(launch.pid, reaped=True)]  # the sleep, reparented, still in the session
    assert launch.pid not in family(launch.pid, reaped=True)  # the reaped pid may be anyone's now

    stopped = supervisor.stop("gpubook-7-1", grace=1.0)

    assert stopped is not None and not stopped.stopped  # the command had ended by itself
    assert wait_for(lambda: not alive(orphan), timeout=5)


def test_the_log_stays_under_its_cap_and_keeps_the_latest_output(supervisor, unix_users, monkeypatch):
    monkeypatch.setattr(launcher, "LOG_MAX_BYTES", 64 * 1024)
    chatty = "i=0; while [ $i -lt 20000 ]; do echo line $i of a chatty launch; i=$((i+1)); done; echo THE END"
    launch = supervisor.start(spec(unix_users[0], "/bin/sh", "-c", chatty))

    finished(supervisor)
    assert wait_for(lambda: supervisor.tail(launch.spec.name).endswith("THE END\n"), timeout=10)
    assert os.path.getsize(launch.log_path) <= 64 * 1024  # about 600 KB were printed
    assert "line 19999 of a chatty launch" in supervisor.tail(launch.spec.name)


def test_forget_drops_an_ended_launch_and_its_log_but_never_a_running_one(supervisor, unix_users):
    running = supervisor.start(spec(unix_users[0], "/bin/sleep", "60", name="gpubook-7-2"))
    ended = supervisor.start(spec(unix_users[0], "/bin/true"))
    finished(supervisor)

    supervisor.forget(ended.spec.name)
    supervisor.forget(running.spec.name)

    assert not os.path.exists(ended.log_path) and supervisor.tail(ended.spec.name) == ""
    assert os.path.exists(running.log_path)
    supervisor.stop(running.spec.name, grace=1)


# -- transient systemd units ---------------------------------------------------------------------------------------
# systemd cannot be PID 1 on these machines: the unit's command line is checked against systemd-run(1) and
# systemd.exec(5) as documented, and a stand-in systemd-run (it records its arguments and what the EnvironmentFile
# holds, prints, and exits as the unit would) shows the supervisor's side: the pipe, the exit status, the stop.


def test_a_units_command_line_asks_systemd_for_the_user_the_limits_and_the_slots_end(unix_users):
    user = unix_users[0]
    account = pwd.getpwnam(user.name)
    spec = LaunchSpec(
        name="gpubook-7-1", user=user.name, argv=("/usr/bin/python3", "train.py"), memory_max_bytes=2**34,
        max_processes=512, runtime_max_seconds=3630, grace_seconds=30, delegate=True,
    )  # fmt: skip

    argv = launcher.unit_argv(spec, account, systemd_run="/usr/bin/systemd-run", env_file="/var/lib/x/gpubook-7-1.env")

    assert argv[:10] == [
        "/usr/bin/systemd-run",
        "--unit=gpubook-7-1",
        f"--uid={user.uid}",
        f"--gid={user.gid}",
        f"--working-directory={account.pw_dir if os.path.isdir(account.pw_dir) else '/'}",
        "--service-type=exec",
        "--collect",
        "--quiet",
        "--pipe",
        "--property=EnvironmentFile=/var/lib/x/gpubook-7-1.env",
    ]
    assert {arg for arg in argv if arg.startswith("--property=")} == {
        "--property=EnvironmentFile=/var/lib/x/gpubook-7-1.env",
        "--property=TimeoutStopSec=30",
        "--property=KillMode=control-group",
        "--property=SendSIGKILL=yes",
        "--property=RuntimeMaxSec=3630",
        "--property=MemoryMax=17179869184",
        "--property=TasksMax=512",
        "--property=Delegate=yes",
    }
    assert argv[-3:] == ["--", "/usr/bin/python3", "train.py"]  # the command after "--": never an option


STAND_IN_SYSTEMD_RUN = """#!/bin/sh
# A stand-in for systemd-run: keeps its arguments and the EnvironmentFile it was given, prints, exits 7.
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
for arg in "$@"; do
  case "$arg" in --property=EnvironmentFile=*) cat "${arg#--property=EnvironmentFile=}" > "$(dirname "$0")/env";; esac
done
echo "unit output"
exit 7
"""


def test_with_units_the_supervisor_runs_systemd_run_and_keeps_the_environment_in_a_root_only_file(
    tmp_path, unix_users, monkeypatch
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemd-run").write_text(STAND_IN_SYSTEMD_RUN)
    (bin_dir / "systemd-run").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    log_dir = tmp_path / "launches"
    log_dir.mkdir(mode=0o700)
    units = Supervisor(log_dir=str(log_dir), uid_min=1000, units=True)

    launch = units.start(spec(unix_users[0], "/bin/sleep", "5", env={"GPUBOOK_TOKEN": "s3cret"}))
    ended = finished(units)

    assert ended.exit_code == 7  # systemd-run --wait passes the unit's exit status on
    assert wait_for(lambda: "unit output" in units.tail(launch.spec.name), timeout=5)
    recorded = (bin_dir / "argv").read_text().splitlines()
    assert recorded[0] == "--unit=gpubook-7-1" and recorded[-3:] == ["--", "/bin/sleep", "5"]
    env_file = log_dir / "gpubook-7-1.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and env_file.stat().st_uid == 0
    environment = (bin_dir / "env").read_text()
    assert 'GPUBOOK_TOKEN="s3cret"' in environment and 'GPUBOOK_LAUNCH="gpubook-7-1"' in environment
    assert f'USER="{unix_users[0].name}"' in environment
    assert not any("s3cret" in arg for arg in recorded)  # never on a command line anyone can read
    units.forget(launch.spec.name)
    assert not env_file.exists()


def test_the_log_keeps_under_its_cap_even_when_each_read_brings_a_whole_cap_of_output(tmp_path, monkeypatch):
    # A command that writes faster than the log's thread reads: every read returns 64 KiB, the cap itself.
    monkeypatch.setattr(launcher, "LOG_MAX_BYTES", 64 * 1024)
    output = tmp_path / "output"
    flood = b"".join(b"line %06d of a flood\n" % number for number in range(20000))  # about 420 KB
    output.write_bytes(flood[-(6 * 64 * 1024) :])  # six reads of 64 KiB each, the last one full too
    log_fd = os.open(tmp_path / "log", os.O_RDWR | os.O_CREAT, 0o600)

    launcher._pump(open(output, "rb"), log_fd)  # noqa: SIM115 - _pump closes what it is given

    kept = (tmp_path / "log").read_bytes()
    assert len(kept) <= 64 * 1024
    assert kept.endswith(b"line 019999 of a flood\n")
