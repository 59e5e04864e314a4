"""Running the real agent in tests: its own process, a real Celery worker on a real Redis broker.

``AgentRun`` writes a config, starts ``python -m gpubook_agent.main`` and sends it signed snapshots
over Celery exactly as the portal does. ``RecordingPortal`` is a small HTTP server that stands in
for the portal's agent endpoints and keeps what the agent reported, so tests can read events; with
``tls=True`` it answers HTTPS with a certificate of ``local_ca()``, a throwaway CA (``CA_FILE``).
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603, S607

from __future__ import annotations

import atexit
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trustme
from celery import Celery
from kombu.utils.uuid import uuid

from gpubook_agent import protocol
from gpubook_agent.config import AgentConfig, config_from_values
from gpubook_agent.gpus.simulated import simulated_uuid
from gpubook_agent.protocol import APPLY_SNAPSHOT_TASK
from gpubook_agent.signing import signed

REPO = Path(__file__).resolve().parents[2]


class Clock:
    """A stopped clock for an enforcer (``clock=``): tests move ``now`` themselves."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def simulated_node_config(home: Path, *, grace: float, **extra: str) -> AgentConfig:
    """The config of a simulated two-GPU node living under ``home`` (state and device files), whose portal and
    broker are never contacted: for tests that drive the enforcer in-process. ``extra`` adds or overrides keys
    (SIMULATED_MIG, say)."""
    return config_from_values(
        {
            "NODE_NAME": f"test-{secrets.token_hex(4)}",
            "BROKER_URL": "redis://127.0.0.1:1/0",
            "PORTAL_URL": "https://127.0.0.1:1",  # never contacted here
            "AGENT_TOKEN": "gpn_test",
            "LEASE_SECRET": secrets.token_hex(32),
            "STATE_DIR": str(home / "state"),
            "DEVICE_DIR": str(home / "dev"),
            "BACKEND": "simulated",
            "SIMULATED_GPUS": "2",
            "GRACE_SECONDS": str(grace),
            **extra,
        }
    )


def getfacl(path: str) -> str:
    """The ACL as the real tool shows it (independent of the code under test)."""
    return subprocess.run(
        ["getfacl", "--omit-header", "--absolute-names", "--", path], capture_output=True, text=True, check=True
    ).stdout


def now() -> datetime:
    return datetime.now(UTC)


def acl_users(path: str) -> set[str]:
    """Named users in the file's ACL, read with the real getfacl (independent of the agent's code)."""
    return {
        line.split(":")[1] for line in getfacl(path).splitlines() if line.startswith("user:") and line.split(":")[1]
    }


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01) -> float | None:
    """Poll until ``condition()`` is true; the monotonic time it first was, or None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(interval)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def terminate(process: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """SIGTERM a test's server process and wait for it; SIGKILL when it does not go in time."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts a TCP connection on ``port`` now."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class LocalCA:
    """A certificate authority made for this test session, and a certificate it issued for 127.0.0.1."""

    def __init__(self) -> None:
        self.ca = trustme.CA(organization_name="gpubook tests")
        self.certificate = self.ca.issue_cert("127.0.0.1", "localhost")
        handle, self.ca_file = tempfile.mkstemp(prefix="gpbt-ca-", suffix=".pem", dir="/tmp")
        os.close(handle)
        self.ca.cert_pem.write_to_path(self.ca_file)
        atexit.register(os.unlink, self.ca_file)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.certificate.configure_cert(context)
        return context

    def serve_tls(self, server: ThreadingHTTPServer) -> str:
        """Make ``server`` answer HTTPS only; its https:// URL."""
        server.socket = self.server_context().wrap_socket(server.socket, server_side=True)
        return f"https://127.0.0.1:{server.server_address[1]}"


@functools.cache
def local_ca() -> LocalCA:
    return LocalCA()


class RecordingPortal:
    """Answers the agent's POSTs with 200 and keeps their bodies, per endpoint."""

    def __init__(self, *, tls: bool = False) -> None:
        self.received: dict[str, list[dict[str, Any]]] = {"heartbeat": [], "events": [], "telemetry": []}
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint = self.path.rstrip("/").rsplit("/", 1)[-1]
                received.setdefault(endpoint, []).append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self.url = serve(Handler, tls=tls)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        found = [event for body in list(self.received["events"]) for event in body["events"]]
        return [event for event in found if kind is None or event["kind"] == kind]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HeaderRecorder:
    """Keeps every request's method, path and headers (whatever the method) and answers 200 ``{}``: the
    "elsewhere" a redirect points to, where the node token must never arrive."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                requests.append((self.command, self.path, dict(self.headers.items())))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = do_PUT = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Redirector:
    """Answers every request with a redirect (``status``, 302 by default) to ``location``, and counts them."""

    def __init__(self, location: str, *, status: int = 302, tls: bool = False) -> None:
        self.location, self.status, self.answered = location, status, 0
        redirector = self

        class Handler(BaseHTTPRequestHandler):
            def _redirect(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                redirector.answered += 1
                self.send_response(redirector.status)
                self.send_header("Location", redirector.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _redirect

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self.url = serve(Handler, tls=tls)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(handler: type[BaseHTTPRequestHandler], *, tls: bool) -> tuple[ThreadingHTTPServer, str]:
    """``handler`` served on a free local port in a thread of its own (over the test CA's TLS with ``tls``),
    and the URL to reach it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    if tls:
        url = local_ca().serve_tls(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, url


class PrivateRedis:
    """A Redis server of the test's own, so the test may stop the broker without touching anyone else's."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait_for(lambda: port_open(self.port), timeout=10) is None:
            self.stop()
            raise RuntimeError("the private redis-server did not start")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


class AgentRun:
    """One simulated node and its agent process."""

    def __init__(
        self,
        *,
        broker_url: str,
        portal_url: str,
        gpus: int = 2,
        grace_seconds: float = 1.0,
        node_name: str | None = None,
        secret: str | None = None,
        token: str = "gpn_test",  # noqa: S107 - the recording portal checks no token
        **settings: Any,
    ) -> None:
        self.node_name = node_name or f"test-{secrets.token_hex(4)}"
        self.queue = protocol.queue_name(self.node_name)
        self.secret = secret or secrets.token_hex(32)
        self.broker_url = broker_url
        self.home = Path(tempfile.mkdtemp(prefix="gpbt-agent-", dir="/tmp"))
        self.home.chmod(0o755)  # the test users must reach the stand-in device files
        self.device_dir = self.home / "dev"
        self.state_dir = self.home / "state"
        self.config_path = self.home / "agent.conf"
        lines = {
            "NODE_NAME": self.node_name,
            "BROKER_URL": broker_url,
            "PORTAL_URL": portal_url,
            "AGENT_TOKEN": token,
            "LEASE_SECRET": self.secret,
            "STATE_DIR": self.state_dir,
            "DEVICE_DIR": self.device_dir,
            "BACKEND": "simulated",
            "SIMULATED_GPUS": gpus,
            "GRACE_SECONDS": grace_seconds,
            "RECONCILE_SECONDS": 1,
            "HEARTBEAT_SECONDS": 1,
            "TELEMETRY_SECONDS": 1,
            # The tests' portals answer on http://127.0.0.1 (unless they are given tls=True).
            "ALLOW_INSECURE_PORTAL": "true" if portal_url.startswith("http://") else "",
            **{key.upper(): value for key, value in settings.items()},
        }
        self.config_path.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        self.version = 0
        self.process: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    # -- the node's GPUs ----------------------------------------------------------------------

    def uuid(self, index: int) -> str:
        return simulated_uuid(self.node_name, index)

    def device(self, index: int) -> str:
        return str(self.device_dir / f"nvidia{index}")

    # -- the agent process ---------------------------------------------------------------------

    def start(self, *, entry: Sequence[str] = ("-m", "gpubook_agent.main"), ready: str = "ready.") -> None:
        """Start the agent and wait until its log says ``ready`` (its worker is ready). ``entry``: what the
        interpreter runs instead of the agent's module (a test's wrapper around ``gpubook_agent.main.main``)."""
        self.log = []
        self.process = subprocess.Popen(
            [sys.executable, *entry, "--config", str(self.config_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._read_log, args=(self.process,), daemon=True).start()
        if wait_for(lambda: any(ready in line for line in self.log), timeout=20) is None:
            raise AssertionError("the agent did not start:\n" + "\n".join(self.log[-40:]))

    def run_until_exit(self) -> subprocess.CompletedProcess[str]:
        """Run the agent in the foreground for a test that expects it to stop by itself (refusing to
        start, say); it would otherwise run until killed."""
        return self._run_command()

    def _read_log(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.log.append(line.rstrip())

    def revoke_all(self) -> subprocess.CompletedProcess[str]:
        """``gpubook-agent revoke-all`` with this node's config, as systemd's ExecStopPost runs it."""
        return self._run_command("revoke-all")

    def _run_command(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpubook_agent.main", *command, "--config", str(self.config_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )

    def kill(self) -> None:
        """SIGKILL: no chance to tidy up, as in a crash."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        terminate(self.process, timeout=15)

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.home, ignore_errors=True)

    # -- what the portal does --------------------------------------------------------------------

    def snapshot(
        self,
        leases: list[dict[str, Any]],
        *,
        version: int | None = None,
        secret: str | None = None,
        issued_at: datetime | None = None,
    ) -> dict:
        if version is None:
            self.version += 1
            version = self.version
        body = protocol.snapshot(
            node=self.node_name,
            version=version,
            issued_at=issued_at or now(),
            horizon_end=now() + timedelta(hours=24),
            leases=leases,
        )
        return signed(body, secret or self.secret)

    def send(self, snapshot: Any, *, broker_url: str | None = None, as_object: bool = False) -> None:
        """Push as the portal does: the snapshot as one JSON string (a string is sent as it is). With
        ``as_object``, as older portals did: the object itself inside the message."""
        if not as_object and not isinstance(snapshot, str):
            snapshot = protocol.snapshot_message(snapshot)
        app = Celery("portal-in-test", broker=broker_url or self.broker_url, set_as_current=False)
        try:
            app.send_task(APPLY_SNAPSHOT_TASK, args=[snapshot], queue=self.queue, routing_key=self.queue, expires=120)
        finally:
            app.close()

    def send_raw(self, body: str | bytes, *, content_type: str = "application/json") -> None:
        """A message for the agent's task whose body is ``body`` as it is, not what a Celery client would
        make of it: what anyone holding the broker URL can put on the queue (kombu decodes the body
        before the task runs)."""
        app = Celery("portal-in-test", broker=self.broker_url, set_as_current=False)
        try:
            task = app.amqp.as_task_v2(uuid(), APPLY_SNAPSHOT_TASK, args=[None])
            with app.connection_for_write() as connection:
                connection.Producer().publish(
                    body,
                    exchange="",
                    routing_key=self.queue,
                    headers=task.headers,
                    content_type=content_type,
                    content_encoding="utf-8" if isinstance(body, str) else "binary",
                    retry=False,
                )
        finally:
            app.close()

    def stored_snapshot(self) -> dict | None:
        path = self.state_dir / "snapshot.json"
        return json.loads(path.read_text()) if path.exists() else None


def lease(reservation: int, user: str, gpus: list[str], start: datetime, end: datetime) -> protocol.Lease:
    return protocol.lease(reservation=reservation, user=user, gpus=gpus, start=start, end=end)
