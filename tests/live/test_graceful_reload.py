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
from types import SimpleNamespace

import pytest
import requests
from django.db import connection
from django.utils import timezone

from portal.gunicorn_worker import Handover
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


# A master killed before its on_exit leaves its handover markers (portal/gunicorn_worker.py, Handover): `docker stop`
# sends SIGKILL after 10 s, within graceful_timeout. In a container the next master is PID 1 again, in the same
# /tmp (`docker restart` keeps it), so markers named after the PID alone were the new master's: a stale booting
# worker younger than its own held every stop and reload for half of graceful_timeout.
STALE_MARKERS = """
for folder in "$0/gpubook-web-$$" "$0/gpubook-web-$$-0123456789abcdef"; do
  mkdir -p "$folder" && touch "$folder/1000.booting" "$folder/x.booting" "$folder/1.ready"
done
exec "$@"
"""
GRACEFUL_TIMEOUT = 120  # a worker would wait 60 s for a stale successor


class ServerAfterAKilledMaster(ProductionServer):
    """gunicorn started by a shell that first leaves, under the PID the master will have (``exec`` keeps it, as a
    container's PID 1 is the same across restarts), the markers a master killed with booting workers left."""

    def __init__(self, tmp: Path, **environment: str) -> None:
        super().__init__(processes=1, **environment)
        self.tmp = tmp

    def command(self) -> list[str]:
        gunicorn, *options = super().command()
        settings = ["--worker-tmp-dir", str(self.tmp), "--graceful-timeout", str(GRACEFUL_TIMEOUT)]
        return ["sh", "-c", STALE_MARKERS, str(self.tmp), gunicorn, *settings, *options]


def test_markers_a_killed_master_left_under_its_pid_delay_no_reload_or_stop(transactional_db, tmp_path):
    server = ServerAfterAKilledMaster(tmp_path)
    server.start()
    written = lambda: server.log_path.read_text(errors="replace")  # noqa: E731
    try:
        assert server.process is not None
        master = server.process.pid
        assert requests.get(f"{server.url}/accounts/login/", timeout=60).status_code == 200  # a worker serves
        assert not list(tmp_path.glob(f"gpubook-web-{master}")) and not list(tmp_path.glob("*-0123456789abcdef"))
        (old,) = worker_pids(written())

        reload_began = time.monotonic()
        os.kill(master, signal.SIGHUP)
        assert wait_for(lambda: gone([old]), timeout=GRACEFUL_TIMEOUT), written()
        reload_took = time.monotonic() - reload_began
        assert requests.get(f"{server.url}/accounts/login/", timeout=60).status_code == 200

        stop_began = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=GRACEFUL_TIMEOUT)
        stop_took = time.monotonic() - stop_began
    finally:
        server.stop()
    print(f"\nafter a killed master: the reload took {reload_took:.1f} s, the stop {stop_took:.1f} s")
    # Well under the 60 s a stale successor would hold each: the reload waits for the new worker to boot only.
    assert reload_took < 40 and stop_took < 30, written()
    assert not list(tmp_path.glob("gpubook-web-*"))  # the master's own folder went with it


def test_a_stray_file_among_the_markers_is_no_successor(tmp_path, monkeypatch):
    monkeypatch.setenv(Handover.RUN_VARIABLE, "")  # the master's start sets it; put back after the test
    cfg = SimpleNamespace(worker_tmp_dir=str(tmp_path))
    handover = Handover.starting(4242, cfg)
    handover.forking(3)
    for stray in ("x.booting", "README", ".booting", "7.booting.tmp"):
        (handover.folder / stray).touch()

    assert handover.successors_booting(2)  # worker 3 boots
    assert not handover.successors_booting(3)  # nothing else does: the stray names are nobody's
    handover.closing()
    assert not handover.successors_booting(2)
