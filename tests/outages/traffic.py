"""What the outage tests do to a running portal: set it up on a database of its own, and drive API clients that
book and read while a dependency goes away, recording every answer for the test to judge.

A portal process here is tests/live/server.py's AsgiServer (portal.serve, daphne) or ProductionServer (gunicorn),
pointed at the test's own PostgreSQL (tests/outages/postgres.py) and Redis (tests/nodes/broker_redis.py).
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from websockets.exceptions import ConnectionClosed

from accounts.services import api_token_create
from nodes.models import Gpu
from nodes.services import node_register
from tests.factories import UserFactory
from tests.live.server import ROOT, session_for


def make_lab() -> dict[str, Any]:
    """Node outage-a100 with four GPUs and four researchers (client0..3, the factories' password), each with an API
    token and a logged-in session: ``{"gpus": [ids], "tokens": [keys], "sessions": [cookie values]}``."""
    node = node_register(name="outage-a100", hostname="a100.lab").node
    gpus = [
        Gpu.objects.create(node=node, index=i, uuid=f"GPU-outage-{i}", model="NVIDIA A100", memory_mib=81920)
        for i in range(4)
    ]
    users = [UserFactory(username=f"client{i}") for i in range(4)]
    return {
        "gpus": [gpu.pk for gpu in gpus],
        "tokens": [api_token_create(user=user, name="outage")[1] for user in users],
        "sessions": [session_for(user) for user in users],
    }


# Run in the portal's own process (manage.py shell), so the rows are the portal's, whatever its database.
_SEED = "import json; from tests.outages.traffic import make_lab; print('SEED' + json.dumps(make_lab()))"


def prepare_database(**environment: str) -> dict[str, Any]:
    """Migrate the portal's database named in ``environment`` (DATABASE_URL, REDIS_URL) and ``make_lab()`` there."""
    env = {**os.environ, **environment}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=600)
    seeded = subprocess.run(
        [*manage, "shell", "-c", _SEED], cwd=ROOT, env=env, timeout=120, capture_output=True, text=True
    )
    if seeded.returncode != 0:
        raise RuntimeError(f"could not make the test's GPUs and researchers:\n{seeded.stderr[-3000:]}")
    line = next(line for line in seeded.stdout.splitlines() if line.startswith("SEED"))
    return json.loads(line.removeprefix("SEED"))


@dataclass
class Answer:
    """One request and what came of it (status 0: no HTTP answer at all)."""

    client: int
    method: str
    path: str
    started: float
    ended: float
    status: int
    retry_after: str | None = None
    code: str | None = None
    message: str | None = None
    booking: int | None = None
    problem: str | None = None


@dataclass
class Traffic:
    """``clients`` API clients, each booking its own GPU slot after slot and reading between bookings, until
    ``stop()``. Every answer is kept in ``answers``."""

    base_url: str
    seed: dict[str, Any]
    clients: int = 4
    answers: list[Answer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # Slots far enough ahead to be bookable, one 15-minute slot after the other per GPU.
        tomorrow = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
        self._first_slot = tomorrow
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.clients)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self, client: int) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.seed['tokens'][client]}"
        gpu = self.seed["gpus"][client]
        slot = 0
        while not self._stopping.is_set():
            start = self._first_slot + timedelta(minutes=15 * slot)
            slot += 1
            body = {
                "gpus": [gpu],
                "start": start.isoformat(),
                "end": (start + timedelta(minutes=15)).isoformat(),
                "purpose": f"outage test {client}",
            }
            self._ask(session, client, "POST", "/api/v1/reservations/", json=body)
            self._ask(session, client, "GET", "/api/v1/reservations/?mine=true")
            self._ask(session, client, "GET", "/api/v1/gpus/")

    def _ask(self, session: requests.Session, client: int, method: str, path: str, **kwargs: Any) -> None:
        started = time.monotonic()
        answer = Answer(client=client, method=method, path=path, started=started, ended=started, status=0)
        try:
            response = session.request(method, f"{self.base_url}{path}", timeout=60, **kwargs)
        except requests.RequestException as error:
            answer.problem = repr(error)
            time.sleep(0.05)  # nothing listening: do not spin
        else:
            answer.status = response.status_code
            answer.retry_after = response.headers.get("Retry-After")
            try:
                data = response.json()
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("error"), dict):
                answer.code, answer.message = data["error"].get("code"), data["error"].get("message")
            elif method == "POST" and response.status_code == 201 and isinstance(data, dict):
                answer.booking = data.get("id")
            if response.status_code >= 400 and answer.code is None:
                answer.problem = response.text[:300]
        answer.ended = time.monotonic()
        with self._lock:
            self.answers.append(answer)

    # --- what came of it ----------------------------------------------------------------------

    def since(self, moment: float) -> list[Answer]:
        with self._lock:
            return [answer for answer in self.answers if answer.started >= moment]

    def wait_for_successes(self, moment: float, count: int, timeout: float = 60) -> None:
        """Until ``count`` answers to requests sent after ``moment`` succeeded (all clients going again)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for answer in self.since(moment) if answer.status in (200, 201)) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(f"the portal did not serve {count} requests again within {timeout} s")

    def failures(self) -> list[Answer]:
        with self._lock:
            return [answer for answer in self.answers if answer.status not in (200, 201)]

    def booked(self) -> list[int]:
        with self._lock:
            return [answer.booking for answer in self.answers if answer.booking is not None]


def back_after(traffic: Traffic, answering: float, until: float = float("inf")) -> float:
    """Seconds from ``answering`` (the dependency answering again) until the portal answered every request: the
    end of the last request before ``until`` that failed (0 when none failed after that moment)."""
    late = [answer.ended for answer in traffic.failures() if answering <= answer.ended < until]
    return max(late, default=answering) - answering


def summary(traffic: Traffic) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for answer in traffic.answers:
        key = f"{answer.method} {answer.status}" + (f" {answer.code}" if answer.code else "")
        counts[key] = counts.get(key, 0) + 1
    return counts


def closing_words(client: Any) -> tuple[list[dict[str, Any]], int | None, str | None]:
    """The messages a live connection (tests/live/server.py's LiveClient) got until the server closed it, and the
    close frame's code and reason (daphne sends no reason; uvicorn does)."""
    received = []
    try:
        while True:
            received.append(client.next(timeout=30))
    except ConnectionClosed as closed:
        if closed.rcvd is None:
            return received, None, None
        return received, closed.rcvd.code, closed.rcvd.reason
