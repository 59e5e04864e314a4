"""Launches on a node (issue 22): how soon a booking's environment runs once its slot opens, and how soon it is gone
once the slot ends, with many slots starting and ending together.

What it measures
    The real enforcer and the real launches (gpubook_agent/launches.py, with their own threads) run in this process
    on 8 simulated GPUs, with a clock that is the real one. One signed snapshot holds N leases (one per GPU and
    user, round robin), each with one plain-command launch (``sh`` that ignores SIGTERM half the time, so those
    are ended by SIGKILL after the grace), all starting together 2 s after the snapshot and ending together
    ``--seconds`` later.

    Start delay: from the slot's start to the launch's process running as its user (the launch_started event).
    Gone delay: from the slot's end to the launch's command being gone (read from /proc), for the
    launches that end on SIGTERM and for those that need SIGKILL after the grace (GRACE_SECONDS, default 2 s
    here). The issue's bound is the grace + 5 s.

How to run it
    As root (it creates throw-away users, and removes them), with the acl package:

        .venv/bin/python bench/launches.py
        .venv/bin/python bench/launches.py --launches 32 --grace 2 --seconds 4

    Nothing else is needed: no database, broker or portal.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench.benchdb import percentile_ms
from gpubook_agent import protocol
from gpubook_agent.config import config_from_values
from gpubook_agent.enforcer import Enforcer
from gpubook_agent.gpus import open_configured_backend
from gpubook_agent.launcher import Supervisor
from gpubook_agent.launches import Launches
from gpubook_agent.signing import signed
from gpubook_agent.store import SnapshotStore

GPUS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=32)
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=4.0, help="how long the slots last")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/launches.py needs root (throw-away users, ACLs, launches as those users)")
    home = Path(tempfile.mkdtemp(prefix="gpbt-bench-launch-", dir="/tmp"))
    home.chmod(0o755)
    users = [f"gpbb_{secrets.token_hex(3)}" for _ in range(GPUS)]
    try:
        for user in users:
            subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", user], check=True)  # noqa: S603, S607
        run(home, users, args.launches, args.grace, args.seconds)
    finally:
        for user in users:
            subprocess.run(["userdel", user], check=False, capture_output=True)  # noqa: S603, S607
        shutil.rmtree(home, ignore_errors=True)


def run(home: Path, users: list[str], count: int, grace: float, seconds: float) -> None:
    config = config_from_values(
        {
            "NODE_NAME": "bench-launches",
            "BROKER_URL": "redis://127.0.0.1:1/0",
            "PORTAL_URL": "https://127.0.0.1:1",
            "AGENT_TOKEN": "gpn_bench",
            "LEASE_SECRET": secrets.token_hex(32),
            "STATE_DIR": str(home / "state"),
            "DEVICE_DIR": str(home / "dev"),
            "BACKEND": "simulated",
            "SIMULATED_GPUS": str(GPUS),
            "GRACE_SECONDS": str(grace),
        }
    )
    backend = open_configured_backend(config)
    store = SnapshotStore(config.state_dir)
    store.prepare()
    started: dict[int, float] = {}

    def report(kind: str, **fields: object) -> None:
        if kind == "launch_started":
            started[int(fields["reservation"])] = time.time()  # type: ignore[call-overload]

    enforcer = Enforcer(config=config, backend=backend, store=store, report=report)
    launches = Launches(
        config=config,
        leases=enforcer,
        report=report,
        supervisor=Supervisor(log_dir=store.launch_log_dir(), accounts=enforcer.accounts),
    )
    enforcer.after_pass = launches.wake
    gpus = [gpu.uuid for gpu in backend.gpus()]
    start = datetime.now(UTC) + timedelta(seconds=2)
    end = start + timedelta(seconds=seconds)
    leases = []
    for number in range(count):
        stubborn = number % 2 == 1
        script = ("trap '' TERM; " if stubborn else "") + "while :; do sleep 0.2; done"
        request = protocol.launch_request(number=1, kind="command", image="", argv=["/bin/sh", "-c", script])
        leases.append(
            protocol.lease(
                reservation=number + 1,
                user=users[number % len(users)],
                gpus=[gpus[number % len(gpus)]],
                start=start,
                end=end,
                launches=[request],
            )
        )
    body = {"node": config.node_name, "version": 1, "issued_at": datetime.now(UTC).isoformat(), "leases": leases}
    enforcer.startup()
    assert enforcer.offer(signed(body, config.lease_secret)) == "applied"
    enforcer.start()
    launches.start(enforcer.clock)
    try:
        deadline = time.time() + 2 + seconds + grace + 30
        while len(started) < count and time.time() < deadline:
            time.sleep(0.01)
        pids = {name: launch.pid for name, launch in launches.supervisor._launches.items()}
        gone: dict[str, float] = {}
        while len(gone) < len(pids) and time.time() < deadline:
            for name, pid in pids.items():
                if name not in gone and _gone(pid):
                    gone[name] = time.time()
            time.sleep(0.01)
    finally:
        launches.stop_all("the bench ended")
        enforcer.stop()
        enforcer.revoke_all()
    start_delays = [at - start.timestamp() for at in started.values()]
    end_at = end.timestamp()
    polite = [gone[f"gpubook-{n + 1}-1"] - end_at for n in range(count) if n % 2 == 0 and f"gpubook-{n + 1}-1" in gone]
    stubborn = [
        gone[f"gpubook-{n + 1}-1"] - end_at for n in range(count) if n % 2 == 1 and f"gpubook-{n + 1}-1" in gone
    ]
    print(f"launches: {count} on {GPUS} GPUs, all starting and ending together; grace {grace:g} s")
    print(f"started:  {len(started)}/{count}; after the slot's start {_figures(start_delays)}")
    print(f"ended on SIGTERM: {len(polite)}; gone after the slot's end {_figures(polite)}")
    print(f"needed SIGKILL:   {len(stubborn)}; gone after the slot's end {_figures(stubborn)}", end="")
    print(f" (bound: grace + 5 s = {(grace + 5) * 1000:.0f} ms)")


def _figures(delays: list[float]) -> str:
    if not delays:
        return "none"
    return f"p50 {percentile_ms(delays, 50):.0f} ms, max {max(delays) * 1000:.0f} ms"


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not reaped yet counts as gone: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1].startswith("Z")
    except OSError:
        return True


if __name__ == "__main__":
    main()
