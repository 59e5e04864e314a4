"""gunicorn's settings for the portal's production web server (the Dockerfile, docker-compose, docs/operations.md):

    gunicorn --config python:portal.gunicorn_conf portal.asgi:application

``WEB_PROCESSES`` worker processes (default 2) of portal/gunicorn_worker.py on ``WEB_BIND`` (default
0.0.0.0:8000). Each holds up to ``DB_POOL_MAX_SIZE`` database connections when the pool is on.
"""

from __future__ import annotations

import os
from typing import Any

from portal.gunicorn_worker import Handover

bind = [os.environ.get("WEB_BIND", "0.0.0.0:8000")]
workers = int(os.environ.get("WEB_PROCESSES", "2"))
worker_class = "portal.gunicorn_worker.PortalUvicornWorker"
# A worker that stops answering gunicorn's heartbeat for this long is replaced (uvicorn notifies it while it
# serves, however long a websocket stays open).
timeout = 60
# How long a stopping worker may take: on a graceful reload (SIGHUP) half of it serving while its successors
# boot, half finishing its requests and draining its connections (portal/gunicorn_worker.py).
graceful_timeout = 30
keepalive = 5
# gunicorn's own lines (workers starting, exiting) on stderr; the requests are logged by the portal's logging.
errorlog = "-"
accesslog = None
# No control socket: nothing here uses it, and a container's home directory may not be writable.
control_socket_disable = True


# The graceful reload's handover (portal/gunicorn_worker.py, Handover): the master marks each worker it forks as
# booting, and forgets it once it has exited; a worker told to stop keeps serving while a younger one boots. The
# markers live in a folder of this master's own, whatever an earlier one with the same PID left behind.
def on_starting(server: Any) -> None:
    Handover.starting(server.pid, server.cfg)


def pre_fork(server: Any, worker: Any) -> None:
    Handover(server.pid, server.cfg).forking(worker.age)


def child_exit(server: Any, worker: Any) -> None:
    Handover(server.pid, server.cfg).exited(worker.age)


def on_exit(server: Any) -> None:
    Handover(server.pid, server.cfg).closing()
