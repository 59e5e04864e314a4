"""``gpubook-agent``: the one command that runs the agent on a GPU server (and ``gpubook-agent revoke-all``, which
takes back what a killed agent left granted).

Order matters at both ends. At start the stored snapshot is enforced (and every grant it does not back removed)
before the agent listens to the broker, so a restart never opens a GPU to anyone it should not. At the end, every
way out (SIGTERM, SIGINT, SIGHUP, SIGQUIT, an exception escaping the worker, an error found after the start) goes
through ``shut_down``, which takes every grant back first and only then stops the launches and the rest: a stopped
agent enforces no slot end, so it leaves every GPU closed. Further stop signals during that are ignored, so a
second Ctrl-C cannot cut it short. What no code sees (SIGKILL, the OOM killer) is the systemd unit's
``ExecStopPost=gpubook-agent revoke-all`` (revoke.py). docs/agent.md, "Stopping", has the order of events.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import warnings
from collections.abc import Callable

from celery.exceptions import SecurityWarning

from gpubook_agent import AGENT_VERSION, procfs, protocol, revoke, selfcheck
from gpubook_agent.config import ConfigError, load_config
from gpubook_agent.enforcer import Enforcer
from gpubook_agent.gpus import BackendUnavailable, GpuBackend, open_configured_backend
from gpubook_agent.launcher import Supervisor, uses_units
from gpubook_agent.launches import Launches
from gpubook_agent.reporter import Reporter
from gpubook_agent.stopping import AgentStopping, stop_signals_ignored, stop_signals_raise
from gpubook_agent.store import SnapshotStore, StateDirLocked, UnsafeStateDir
from gpubook_agent.worker import make_app, make_worker

log = logging.getLogger("gpubook.agent")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpubook-agent", description="GPU booking portal node agent")
    parser.add_argument(
        "command",
        nargs="?",
        choices=("run", "revoke-all"),
        default="run",
        help="run the agent (the default), or revoke-all: take back every grant a stopped or killed agent left",
    )
    parser.add_argument("--config", help="KEY=value config file (default /etc/gpubook/agent.conf)")
    parser.add_argument(
        "--check", action="store_true", help="check this server and the config (OK/WARN/FAIL each), then exit"
    )
    parser.add_argument("--json", action="store_true", help="with --check: print the results as JSON")
    args = parser.parse_args(argv)
    if args.json and not args.check:
        parser.error("--json goes with --check")
    if args.check and args.command != "run":
        parser.error("--check goes alone")
    if args.check:
        return selfcheck.main(args.config, as_json=args.json)
    if args.command == "revoke-all":
        return revoke.main(args.config)
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"gpubook-agent: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        backend = open_configured_backend(config)
    except BackendUnavailable as error:
        print(f"gpubook-agent: {error}", file=sys.stderr)
        return 2
    store = SnapshotStore(config.state_dir)
    try:
        # What the agent reads at start decides whose processes it may end: only from a directory of its own.
        store.prepare()
        store.hold_lock()  # one agent per STATE_DIR; revoke-all waits for it to be gone
    except UnsafeStateDir as error:
        backend.close()
        print(f"gpubook-agent: {error}", file=sys.stderr)
        return 2
    except StateDirLocked as error:
        backend.close()
        print(f"gpubook-agent: {error}: stop it first", file=sys.stderr)
        return 2
    except OSError as error:
        backend.close()
        print(f"gpubook-agent: cannot use STATE_DIR {config.state_dir}: {error}", file=sys.stderr)
        return 2

    reporter = Reporter(config)
    enforcer = Enforcer(config=config, backend=backend, store=store, report=reporter.event)
    launches = Launches(
        config=config,
        leases=enforcer,
        report=reporter.event,
        supervisor=Supervisor(
            log_dir=store.launch_log_dir(),
            accounts=enforcer.accounts,
            units=uses_units(config.launch_runner, systemd_run=shutil.which("systemd-run")),
        ),
        changed=reporter.heartbeat_soon,
    )
    enforcer.after_pass = launches.wake
    reporter.heartbeat = lambda: heartbeat_body(config.backend, backend, enforcer, launches)
    reporter.telemetry = lambda: telemetry_body(backend, enforcer)
    # The pull: when heartbeat replies show the portal ahead of what this node has seen.
    reporter.seen_version = lambda: enforcer.seen_version
    reporter.offer = enforcer.offer

    # From here on a stop signal raises AgentStopping wherever the main thread is, so the shut-down below runs
    # even when it comes before the worker has its own handlers (which stop it warmly instead).
    stop_signals_raise()
    exitcode = 1
    try:
        enforcer.startup()
        enforcer.start()
        launches.start(enforcer.clock)
        reporter.start()
        log.info(
            "agent %s for node %s: %d GPU(s), %d MIG slice(s), queue %s",
            AGENT_VERSION,
            config.node_name,
            len(enforcer.paths),
            len(enforcer.access.slices),
            config.queue,
        )
        # The agent must be root (ACLs on /dev, signals to any user's processes). Celery warns about that for
        # workers that unpickle; ours accepts JSON only, and the warning would only alarm admins.
        warnings.filterwarnings("ignore", category=SecurityWarning)
        app = make_app(broker_url=config.broker_url, queue=config.queue, offer=enforcer.offer, refuse=enforcer.refuse)
        worker = make_worker(app, node_name=config.node_name, loglevel=config.log_level.upper())
        worker.start()
        exitcode = worker.exitcode or 0
    except AgentStopping as stopping:
        log.info("%s: stopping", stopping)
        exitcode = 0
    except BaseException:
        log.exception("the agent failed; every grant is taken back before it exits")
        exitcode = 1
    finally:
        shut_down(enforcer=enforcer, launches=launches, reporter=reporter, backend=backend)
        store.release_lock()
    return exitcode


def shut_down(*, enforcer: Enforcer, launches: Launches, reporter: Reporter, backend: GpuBackend) -> None:
    """The one way out: grants first (milliseconds), then what may take seconds. Each step runs whatever the one
    before it raised, and stop signals are ignored meanwhile."""
    stop_signals_ignored()
    steps: list[tuple[str, Callable[[], object]]] = [
        ("stopping the enforcer", enforcer.stop),  # no pass grants anything from here on
        ("taking every grant back", lambda: _revoke_all(enforcer)),  # fail closed
        ("", enforcer.close),
        # With the GPUs closed, nothing of a slot runs on.
        ("stopping the launches", lambda: launches.stop_all("the node's agent stopped")),
        ("", enforcer.restore_power),  # and no idle power cap: nothing would lift it for a booking
        ("", reporter.stop),  # last, so the events above are sent
        ("", backend.close),
    ]
    for what, step in steps:
        try:
            step()
        except Exception:
            log.exception("while stopping: %s failed", what or getattr(step, "__name__", "a step"))


def _revoke_all(enforcer: Enforcer) -> None:
    remaining = enforcer.revoke_all()
    if remaining:
        log.error("grants left after the stop (revoke-all can be run again): %s", remaining)
    else:
        log.info("every grant taken back")


def heartbeat_body(kind: str, backend: GpuBackend, enforcer: Enforcer, launches: Launches) -> protocol.Heartbeat:
    return protocol.heartbeat(
        backend=kind,
        driver_version=backend.driver_version,
        applied_version=enforcer.applied_version,
        acls=enforcer.acls_in_force(),
        drained=enforcer.drained,
        mig=enforcer.mig_layout(),
        launches=launches.statuses(),
    )


def telemetry_body(backend: GpuBackend, enforcer: Enforcer) -> list[protocol.GpuReading]:
    """One sample per GPU and MIG slice, each process with its owner's name; the pids also feed the enforcer."""
    samples = backend.sample()
    enforcer.note_gpu_processes({sample.uuid: {p.pid for p in sample.processes} for sample in samples})
    reported = []
    for sample in samples:
        data = sample.as_dict()
        for process in data["processes"]:
            uid = procfs.process_uid(process["pid"])
            process["user"] = procfs.user_name(uid) if uid is not None else None
        reported.append(data)
    return reported


if __name__ == "__main__":
    sys.exit(main())
