"""Run a harmless job, as its owner, on the stand-in GPUs of every running demo booking (scripts/run starts
this): reservations/demo_jobs.py says how. Runs until stopped (SIGTERM or Ctrl-C), then stops its jobs."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from gpubook_agent.gpus.simulated import DEMO_DEVICE_ROOT
from reservations.demo_jobs import DemoJobs, job_python, running_bookings, skip_reason

log = logging.getLogger("reservations.demo_jobs")


class Command(BaseCommand):
    help = "Run a job as its owner on the stand-in GPUs of each running demo booking, until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--device-root", default=DEMO_DEVICE_ROOT, help=f"as given to demo_agents (default {DEMO_DEVICE_ROOT})"
        )
        parser.add_argument("--python", help="the interpreter jobs run with (default: the system's python3)")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between looks at the bookings")
        parser.add_argument("--busy-seconds", type=float, default=180.0, help="each busy phase (files held open)")
        parser.add_argument("--idle-seconds", type=float, default=60.0, help="each idle phase (files closed)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["interval"] <= 0 or options["busy_seconds"] <= 0 or options["idle_seconds"] < 0:
            raise CommandError("--interval and --busy-seconds must be above 0, --idle-seconds at least 0")
        stop = threading.Event()
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: stop.set())
        python = options["python"] or job_python()
        reason = skip_reason(python)
        if reason:
            # Said once; then idle rather than exit, since honcho would stop the whole demo with it.
            self.stderr.write(reason)
            stop.wait()
            return
        assert python is not None
        jobs = DemoJobs(python=python, busy_seconds=options["busy_seconds"], idle_seconds=options["idle_seconds"])
        self.stdout.write(f"demo jobs: one per running booking of a simulated node, with {python}")
        try:
            while not stop.is_set():
                close_old_connections()  # a restarted database must not end the demo
                try:
                    wanted = running_bookings(now=timezone.now(), device_root=options["device_root"])
                except DatabaseError as error:
                    log.warning("cannot read the bookings (%s); jobs left as they are", error)
                else:
                    jobs.sync(wanted)
                stop.wait(options["interval"])
        finally:
            jobs.stop_all()
