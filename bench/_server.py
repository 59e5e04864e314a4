"""The portal served for the benchmarks that go over HTTP: daphne (``portal.asgi:application``) on a
free port of 127.0.0.1, as production runs it, and a keep-alive HTTP client with an API token.

The server runs with DEBUG=0 and rates so high that throttling never answers 429: a benchmark
measures the portal's work, not its limits. It inherits this process's environment, so a bench
sets what else it needs (STATIC_ROOT, AGENT_OFFLINE_AFTER_SECONDS...) in os.environ first.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from bench.benchdb import REPO_ROOT

HOST = "127.0.0.1"
UNTHROTTLED = "100000000/minute"
SERVER_START_TIMEOUT = 60.0
REQUEST_TIMEOUT = 120.0
# A server closed an idle keep-alive connection (uvicorn does after 5 s): the request goes once more, on a new one.
STALE_CONNECTION = (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected)
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception): ")  # a traceback's last line


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def daphne_path() -> str:
    beside = Path(sys.executable).parent / "daphne"
    return str(beside if beside.exists() else REPO_ROOT / ".venv" / "bin" / "daphne")


def start_server(url: str, port: int, log: IO[bytes], processes: int = 0) -> subprocess.Popen[bytes]:
    """daphne (one process, as scripts/run), or with ``processes`` the production server: gunicorn with that
    many uvicorn workers (portal/gunicorn_conf.py, as the Dockerfile runs it)."""
    env = os.environ | {
        "DATABASE_URL": url,
        "DEBUG": "0",
        "API_RATE_PER_TOKEN": UNTHROTTLED,
        "API_RATE_PER_AGENT": UNTHROTTLED,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    command = [daphne_path(), "-b", HOST, "-p", str(port), "portal.asgi:application"]
    if processes:
        env |= {"WEB_PROCESSES": str(processes), "WEB_BIND": f"{HOST}:{port}"}
        gunicorn = str(Path(daphne_path()).parent / "gunicorn")
        command = [gunicorn, "--config", "python:portal.gunicorn_conf", "portal.asgi:application"]
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603


def wait_for_server(server: subprocess.Popen[bytes], port: int) -> None:
    """Return once the server answers any HTTP request; raise if it exits or takes too long."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"daphne exited with status {server.returncode}")
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            conn.request("GET", "/api/v1/")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"daphne did not answer within {SERVER_START_TIMEOUT:.0f} s")


def stop_server(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def print_log_tail(log: IO[bytes], lines: int = 30) -> None:
    log.flush()
    log.seek(0)
    tail = log.read().decode(errors="replace").splitlines()[-lines:]
    print("daphne log (tail):", *tail, sep="\n  ", file=sys.stderr)


@contextmanager
def serving(
    url: str, port: int | None = None, log: IO[bytes] | None = None, processes: int = 0
) -> Iterator[tuple[int, IO[bytes]]]:
    """The web server (``start_server``) on ``url``'s database, on ``port`` (a free one if None), up and
    answering; yields (port, log). The tail of its log is printed if anything inside fails; it is stopped on the way
    out. ``log`` takes the server's output: pass one to read it afterwards, else a temporary file
    is used and closed with the block."""
    with ExitStack() as stack:
        if log is None:
            log = stack.enter_context(tempfile.TemporaryFile())
        port = port or free_port()
        server = start_server(url, port, log, processes)
        try:
            wait_for_server(server, port)
            yield port, log
        except Exception:
            print_log_tail(log)
            raise
        finally:
            stop_server(server)


def print_server_exceptions(log: IO[bytes], most: int = 5) -> None:
    """The exceptions the server logged (the last line of each traceback), the ``most`` commonest
    with their counts."""
    log.flush()
    log.seek(0)
    lines = log.read().decode(errors="replace").splitlines()
    found = Counter(line.strip() for line in lines if EXCEPTION_LINE.match(line))
    if found:
        print("exceptions in the daphne log:")
    for line, count in found.most_common(most):
        print(f"  {count} x {line[:300]}")


class Client:
    """One keep-alive connection with a bearer token; reconnects if the server drops it."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.conn = http.client.HTTPConnection(HOST, port, timeout=REQUEST_TIMEOUT)

    def send(self, method: str, path: str, payload: dict[str, Any] | bytes | None = None) -> tuple[int, bytes]:
        """One request with ``payload`` as its JSON body (bytes: encoded already); returns the status and
        the answer's body."""
        body = json.dumps(payload).encode() if isinstance(payload, dict) else payload
        headers = self.headers | ({"Content-Type": "application/json"} if body is not None else {})
        for retry in (True, False):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as error:
                self.conn.close()
                self.conn = http.client.HTTPConnection(HOST, self.port, timeout=REQUEST_TIMEOUT)
                if not retry or not isinstance(error, STALE_CONNECTION):
                    raise
        raise AssertionError("the loop returns or raises")

    def close(self) -> None:
        self.conn.close()
