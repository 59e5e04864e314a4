"""The portal's real ASGI server in a subprocess, on the test database, for the websocket and live-page tests:
daphne through portal/serve.py, as scripts/run starts it, or gunicorn with uvicorn workers, as the Dockerfile
and docker-compose do (ProductionServer); and a small synchronous websocket client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from django.utils import timezone
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from gpubook_agent import protocol
from tests.agent.harness import free_port, port_open, terminate, wait_for

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The URL of the test database this pytest process created (PostgreSQL)."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


INGEST = [sys.executable, "manage.py", "consume_telemetry"]


def ingest_environment(**environment: str) -> dict[str, str]:
    """The environment of the ingest process (``INGEST``, queued telemetry) on the test database."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "TELEMETRY_INGEST": "queue",
        **environment,
    }


def start_ingest(**environment: str) -> subprocess.Popen[bytes]:
    """The ingest process, as the Procfile's "ingest", on the test database; its log goes to the test's."""
    return subprocess.Popen(INGEST, cwd=ROOT, env=ingest_environment(**environment), stdout=subprocess.DEVNULL)  # noqa: S603


class AsgiServer:
    def __init__(self, **environment: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws/live/"
        self.environment = environment
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(settings.VAR_DIR) / f"daphne-{self.port}.log"

    def start(self) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "REDIS_URL": settings.REDIS_URL,
            # DEBUG lets WhiteNoise serve static files from static/ (no collectstatic in tests).
            "DEBUG": "1",
            "SECRET_KEY": settings.SECRET_KEY,
            "API_RATE_PER_AGENT": "100000/minute",
            **self.environment,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603  (fixed arguments)
                self.command(), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        if not wait_for(self._answers, timeout=30, interval=0.1):
            self.stop()
            raise RuntimeError(f"the web server did not start:\n{self.log()}")

    def command(self) -> list[str]:
        """The web process as the Procfile (scripts/run) runs it: daphne through portal/serve.py."""
        return [
            sys.executable,
            "-m",
            "portal.serve",
            "-b",
            "127.0.0.1",
            "-p",
            str(self.port),
            "portal.asgi:application",
        ]

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"daphne exited:\n{self.log()}")
        return port_open(self.port)

    def stop(self) -> None:
        terminate(self.process)
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


class ProductionServer(AsgiServer):
    """The web server as the Dockerfile and docker-compose run it: gunicorn with ``processes`` uvicorn workers
    on one port (portal/gunicorn_conf.py)."""

    def __init__(self, processes: int = 2, **environment: str) -> None:
        super().__init__(WEB_PROCESSES=str(processes), **environment)
        self.environment["WEB_BIND"] = f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        return [gunicorn, "--config", "python:portal.gunicorn_conf", "portal.asgi:application"]


class LiveClient:
    """A websocket client that reads JSON messages, skipping those a test is not waiting for."""

    def __init__(self, websocket: ClientConnection) -> None:
        self.websocket = websocket

    def send(self, message: Any) -> None:
        self.websocket.send(message if isinstance(message, str) else json.dumps(message))

    def next(self, timeout: float = 5.0) -> dict[str, Any]:
        return json.loads(self.websocket.recv(timeout=timeout))

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> dict[str, Any]:
        """The first message for which predicate(message) is true; skips the others."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no such message arrived")
            message = self.next(timeout=left)
            if predicate(message):
                return message

    def subscribe(self, *topics: str) -> list[dict[str, Any]]:
        """Subscribe; the messages up to and including "subscribed" (the snapshot among them)."""
        self.send({"subscribe": list(topics)})
        received = []
        while not received or received[-1]["type"] != "subscribed":
            received.append(self.next())
        return received

    def close(self) -> None:
        self.websocket.close()


def open_client(server: AsgiServer, *, token: str | None = None, session: str | None = None, origin: str | None = None):
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if session is not None:
        headers["Cookie"] = f"{settings.SESSION_COOKIE_NAME}={session}"
    websocket = ws_connect(server.ws_url, additional_headers=headers, origin=origin, open_timeout=10, legacy=True)
    return LiveClient(websocket)


# --- what a browser or an agent sends ---------------------------------------------------------


def session_for(user) -> str:
    """A logged-in session of ``user``, as the login form would create it: the cookie's value."""
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def post_agent(server: AsgiServer, lab: dict[str, Any], endpoint: str, body: dict[str, Any]) -> requests.Response:
    """POST a report to the server as the lab node's agent."""
    return requests.post(
        f"{server.url}/api/v1/agent/{endpoint}/",
        json=body,
        headers={"Authorization": f"Bearer {lab['agent_token']}"},
        timeout=10,
    )


def heartbeat() -> protocol.Heartbeat:
    return protocol.heartbeat(
        backend="simulated", driver_version=None, applied_version=1, acls={}, drained=[], sent_at=timezone.now()
    )


def telemetry(utilization: int, uuid: str = "GPU-live-0") -> dict[str, Any]:
    return {
        "sent_at": timezone.now().isoformat(),
        "gpus": [
            {
                "uuid": uuid,
                "utilization_pct": utilization,
                "memory_used_mib": 4096,
                "memory_total_mib": 81920,
                "temperature_c": 64,
                "power_w": 231.0,
                "processes": [{"pid": 4242, "user": "rita", "used_memory_mib": 4000}],
            }
        ],
    }
