"""The production web server's worker: uvicorn under gunicorn, several processes on one port.

gunicorn starts ``WEB_PROCESSES`` of these (portal/gunicorn_conf.py) and restarts any that dies; each is an
ASGI server of its own (HTTP and the websockets), with its own database pool and channel-layer connection,
so the Redis pub/sub channel layer fans every broadcast out to all of them and the rate limits are counted
in Redis for all of them (docs/operations.md, "Scaling out"). ``scripts/run`` keeps one daphne process
(portal/serve.py).

Three things differ from uvicorn's defaults, on purpose:
- No proxy headers: the portal reads the client's address itself, ``NUM_PROXIES`` entries from the right of
  X-Forwarded-For (portal/settings.py); uvicorn rewriting it from the header first would let a client name
  its own address to the lockouts and rate limits.
- The access log goes through the portal's logging (settings.LOGGING), like daphne's in portal/serve.py: the
  RedactSecrets filter takes calendar feed secrets out of the paths, and LOG_FORMAT=json applies.
- No websocket compression (permessage-deflate): see CONFIG_KWARGS.

And a graceful reload (SIGHUP to gunicorn: new workers start, the old ones are told to stop) fails no request
(docs/operations.md, "Restarting the web processes without failing a request"; tests/live/test_graceful_reload.py).
uvicorn alone lost some and stalled the rest:
- gunicorn signals the old workers as soon as it has forked the new ones, which then take seconds to load the
  portal; uvicorn stopped accepting at once, so every request in that time waited in the socket's backlog
  (3-7 s measured). An old worker keeps serving until its successors are ready (``Handover``): the master marks
  each worker it forks as booting (portal/gunicorn_conf.py's hooks), the worker marks itself ready once it
  serves.
- uvicorn closed every idle keep-alive connection at once, and a request the client sent on it at that moment
  was reset ("Connection reset by peer"), as was a connection accepted before its request arrived. An old
  worker now drains instead (``DrainingH11Protocol``): it answers every request it receives with
  "Connection: close" and lets an idle connection go at its keep-alive timeout, as it does any day.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from gunicorn.arbiter import Arbiter  # type: ignore[import-untyped]
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

CLOSE = (b"connection", b"close")


class DrainingH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, but a graceful stop drains the connection instead of closing it when idle:
    the request in progress and any the client sends from now on are answered with "Connection: close", so the
    client opens its next connection elsewhere, and an idle connection goes at its keep-alive timeout as usual.
    uvicorn's own stop closed an idle connection at once, resetting a request sent on it at that moment."""

    draining = False

    def shutdown(self) -> None:
        self.draining = True
        if self.cycle is not None and not self.cycle.response_complete:
            self._close_after(self.cycle)
        elif self.timeout_keep_alive_task is None:
            # Accepted, and its first request not here yet: it gets the keep-alive time to arrive.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def handle_events(self) -> None:
        super().handle_events()
        if self.draining and self.cycle is not None and not self.cycle.response_complete:
            self._close_after(self.cycle)

    @staticmethod
    def _close_after(cycle: Any) -> None:
        cycle.keep_alive = False
        # uvicorn says "Connection: close" in the response when the request did: so that the client knows before
        # it sends its next request on this connection.
        if not cycle.response_started and CLOSE not in cycle.scope["headers"]:
            cycle.scope["headers"].append(CLOSE)


class Handover:
    """Markers in a folder of the gunicorn master's, one per worker, named by the worker's age (gunicorn numbers
    the workers it forks in order): ``<age>.booting`` from the master's fork until the worker serves, then
    ``<age>.ready``, gone when the worker has exited. A worker told to stop first waits, serving, while a younger
    one is booting: on a graceful reload those are its successors; on a plain stop there is none.

    The folder is the master's alone: named after its PID and a random token it draws at its start (``starting``,
    kept in the environment variable ``RUN_VARIABLE``, which the workers it forks inherit). A master killed before
    its ``on_exit`` (``docker stop`` sends SIGKILL after 10 s, within graceful_timeout) leaves its folder behind,
    and in a container the next master has the same PID (1) and the same /tmp (``docker restart`` keeps it): a
    stale ``<age>.booting`` younger than the new workers would hold every later stop for half of graceful_timeout.
    The new master never reads that folder, and removes the folders its PID had before (no live master has its
    PID: masters in containers of their own that share a tmp folder need worker_tmp_dir apart)."""

    RUN_VARIABLE = "GPUBOOK_WEB_RUN"

    def __init__(self, master_pid: int, cfg: Any) -> None:
        self.tmp = Path(cfg.worker_tmp_dir or tempfile.gettempdir())
        token = os.environ.get(self.RUN_VARIABLE, "")
        self.folder = self.tmp / f"gpubook-web-{master_pid}-{token}"

    # The master's side: gunicorn_conf.py's hooks.
    @classmethod
    def starting(cls, master_pid: int, cfg: Any) -> Handover:
        """The master's start, before it forks: a token of its own, and the folders an earlier master with this PID
        left (no live master has its PID) go."""
        os.environ[cls.RUN_VARIABLE] = secrets.token_hex(8)
        handover = cls(master_pid, cfg)
        for stale in (handover.tmp / f"gpubook-web-{master_pid}", *handover.tmp.glob(f"gpubook-web-{master_pid}-*")):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        return handover

    def forking(self, age: int) -> None:
        self.folder.mkdir(mode=0o700, exist_ok=True)
        (self.folder / f"{age}.booting").touch()

    def exited(self, age: int) -> None:
        for state in ("booting", "ready"):
            (self.folder / f"{age}.{state}").unlink(missing_ok=True)

    def closing(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    # The worker's side.
    def serving(self, age: int) -> None:
        # Without the portal's gunicorn_conf.py there are no markers, and nobody waits.
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{age}.booting").rename(self.folder / f"{age}.ready")

    def successors_booting(self, age: int) -> bool:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return False
        return any(
            state == "booting" and number.isdigit() and int(number) > age
            for number, _, state in (name.partition(".") for name in names)
        )


class HandoverServer(Server):
    """uvicorn's server, which on a stop first keeps serving while its successors boot (at most ``wait``
    seconds), then stops accepting and drains its connections (``DrainingH11Protocol``)."""

    def __init__(self, config: Config, *, handover: Handover, age: int, wait: float) -> None:
        super().__init__(config=config)
        self.handover, self.age, self.wait = handover, age, wait

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.handover.serving(self.age)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        deadline = time.monotonic() + self.wait
        while self.handover.successors_booting(self.age) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets=sockets)


class PortalUvicornWorker(UvicornWorker):
    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto",
        "http": DrainingH11Protocol,
        "proxy_headers": False,
        "server_header": False,
        "lifespan": "off",  # the portal has no startup or shutdown work; saying so spares a log line per process
        # No permessage-deflate: every live update would be compressed once per open page (the same text 500
        # times), which took a ninth of a web process's CPU under bench/live.py; the updates are small JSON.
        "ws_per_message_deflate": False,
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # UvicornWorker hands uvicorn's loggers to gunicorn's handlers; the portal's own (the root logger's,
        # configured from settings.LOGGING when the application loads) write them instead.
        for name in ("uvicorn.access", "uvicorn.error"):
            logger = logging.getLogger(name)
            logger.handlers = []
            logger.propagate = True
            logger.setLevel(logging.INFO)
        # A stop takes at most gunicorn's graceful_timeout, half of it waiting for successors, half draining: past
        # it uvicorn cancels what still runs, where gunicorn would have no deadline for a reload's old workers.
        self.config.timeout_graceful_shutdown = max(int(self.cfg.graceful_timeout / 2), 1)

    async def _serve(self) -> None:
        """UvicornWorker's, with the portal's server."""
        self.config.app = self.wsgi
        server = HandoverServer(
            config=self.config, handover=Handover(self.ppid, self.cfg), age=self.age, wait=self.cfg.graceful_timeout / 2
        )
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
