"""The ingest process: store the telemetry the web processes queued (nodes/telemetry_queue.py).

Runs until SIGTERM or SIGINT, which end it between batches. One is enough for a fleet of 1,000 nodes
(docs/operations.md); a second one is safe, and waits on the first's lock while it stores a batch.
``--once`` stores what is waiting now and exits (tests, and draining by hand).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from kernel.runtime import freeze_loaded_objects
from nodes.telemetry_queue import telemetry_consume, telemetry_consume_forever


class Command(BaseCommand):
    help = "Store the telemetry reports queued by the web processes, in batches, until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="store what is queued now, then exit")

    def handle(self, *args: Any, once: bool, **options: Any) -> None:
        if once:
            total = 0
            while taken := telemetry_consume():
                total += taken
            self.stdout.write(f"{total} telemetry reports stored")
            return
        if settings.TELEMETRY_INGEST != "queue":
            self.stdout.write("TELEMETRY_INGEST is not 'queue': the web processes store telemetry themselves")
        freeze_loaded_objects()
        stop = threading.Event()
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: stop.set())
        self.stdout.write(f"storing queued telemetry in batches of up to {settings.TELEMETRY_BATCH_REPORTS} reports")
        telemetry_consume_forever(stop)
