"""Restarting the web tier under load fails no request (docs/operations.md, "Restarting without failing a
request"): gunicorn's graceful reload (SIGHUP: new workers start, the old ones finish what they serve and go)
while clients book and read through the production server."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.db import connection
from django.utils import timezone

from reservations.models import Reservation
from tests.agent.harness import wait_for
from tests.live.server import ProductionServer

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the server shares the test database"),
]

CLIENTS = 6


@dataclass
class Outcome:
    started: float
    took: float
    what: str
    status: int | None = None
    error: str = ""
    booking: int | None = None


@dataclass
class Load:
    """Clients that each read and book in turn through one keep-alive connection (as a proxy or a script
    does), until told to stop."""

    url: str
    token: str
    gpus: list[int]
    keep_alive: bool = True
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    slots: int = 0

    def next_slot(self) -> int:
        with self.lock:
            self.slots += 1
            return self.slots

    def client(self) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.token}"
        if not self.keep_alive:
            session.headers["Connection"] = "close"
        first = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
        while not self.stop.is_set():
            for what in ("read", "book"):
                began = time.monotonic()
                outcome = Outcome(started=began, took=0.0, what=what)
                try:
                    if what == "read":
                        response = session.get(f"{self.url}/api/v1/gpus/", timeout=60)
                    else:
                        slot = self.next_slot()
                        start = first + timedelta(minutes=15 * (slot // len(self.gpus)))
                        body = {
                            "gpus": [self.gpus[slot % len(self.gpus)]],
                            "start": start.isoformat(),
                            "end": (start + timedelta(minutes=15)).isoformat(),
                        }
                        response = session.post(f"{self.url}/api/v1/reservations/", json=body, timeout=60)
                        if response.status_code == 201:
                            outcome.booking = response.json()["id"]
                    outcome.status = response.status_code
                    if response.status_code >= 400:
                        outcome.error = response.text[:300]
                except requests.RequestException as error:
                    outcome.error = f"{type(error).__name__}: {error}"
                outcome.took = time.monotonic() - began
                with self.lock:
                    self.outcomes.append(outcome)


def worker_pids(log: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"Booting worker with pid: (\d+)", log)]


def gone(pids: list[int]) -> bool:
    return not any(Path(f"/proc/{pid}").exists() for pid in pids)


@pytest.mark.parametrize("keep_alive", [True, False], ids=["keep-alive", "a-connection-each"])
def test_a_graceful_reload_under_load_fails_no_request(live_lab, keep_alive):
    server = ProductionServer(processes=2, API_RATE_PER_TOKEN="1000000/minute")
    server.start()
    written = lambda: server.log_path.read_text(errors="replace")  # noqa: E731
    load = Load(server.url, live_lab["researcher_token"], [gpu.pk for gpu in live_lab["gpus"]], keep_alive=keep_alive)
    clients = [threading.Thread(target=load.client) for _ in range(CLIENTS)]
    try:
        assert wait_for(lambda: len(worker_pids(written())) == 2, timeout=30), written()
        old = worker_pids(written())
        for client in clients:
            client.start()
        assert wait_for(lambda: len(load.outcomes) >= 40, timeout=60)

        reload_began = time.monotonic()
        os.kill(server.process.pid, signal.SIGHUP)
        assert wait_for(lambda: len(worker_pids(written())) == 4, timeout=60), written()
        assert wait_for(lambda: gone(old), timeout=60), written()
        reload_ended = time.monotonic()
        ended_at = len(load.outcomes)
        assert wait_for(lambda: len(load.outcomes) >= ended_at + 40, timeout=60)
    finally:
        load.stop.set()
        for client in clients:
            client.join(timeout=90)
        server.stop()

    before = [o for o in load.outcomes if o.started + o.took < reload_began]
    during = [o for o in load.outcomes if o.started + o.took >= reload_began and o.started <= reload_ended]
    failed = [o for o in load.outcomes if o.error or o.status not in (200, 201)]
    print(
        f"\n{'keep-alive' if keep_alive else 'a connection each'}: {len(during)} requests during the reload "
        f"({reload_ended - reload_began:.1f} s from SIGHUP until the old workers were gone), {len(failed)} failed "
        f"of {len(load.outcomes)}; the longest {max(o.took for o in during) * 1000:.0f} ms "
        f"(before the reload {max(o.took for o in before) * 1000:.0f} ms)"
    )
    assert not failed, [f"{o.what}: {o.status} {o.error}" for o in failed]
    assert len(during) >= 10
    booked = {o.booking for o in load.outcomes if o.booking is not None}
    assert set(Reservation.objects.filter(pk__in=booked).values_list("pk", flat=True)) == booked
