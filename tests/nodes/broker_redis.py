"""A redis-server of the test's own, hardened as docs/agent.md says, for the nodes' broker users.

Redis ACL users belong to a whole server, not to one database, so tests that make them never use the
shared Redis: each starts its own (``AclRedis``), whose default user needs a password (the portal's),
and points the portal at it (``use_for_portal``), the portal's Celery app included.
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import secrets
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from tests.agent.harness import free_port, local_ca, port_open, wait_for


class AclRedis:
    """redis-server on a free port of 127.0.0.1, no persistence (as scripts/redis and docker-compose run it:
    ACL users made at run time are lost on a restart), the default user behind ``portal_password``."""

    def __init__(self, *extra: str, database: int = 3, tls_dir: Path | None = None) -> None:
        self.port = free_port()
        self.database = database
        self.portal_password = secrets.token_urlsafe(16)
        self.extra = extra
        self.tls_dir = tls_dir
        if tls_dir is not None:  # TLS only, with a certificate of the tests' own CA (harness.local_ca)
            certificate = local_ca().certificate
            certificate.cert_chain_pems[0].write_to_path(str(tls_dir / "redis.crt"))
            certificate.private_key_pem.write_to_path(str(tls_dir / "redis.key"))
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        """The portal's own URL (the default user, with its password)."""
        if self.tls_dir is not None:
            query = f"ssl_cert_reqs=required&ssl_ca_certs={local_ca().ca_file}"
            return f"rediss://:{self.portal_password}@127.0.0.1:{self.port}/{self.database}?{query}"
        return f"redis://:{self.portal_password}@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> None:
        command = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.tls_dir is None:
            command += ["--port", str(self.port)]
        else:
            command += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            command += [
                "--tls-cert-file",
                str(self.tls_dir / "redis.crt"),
                "--tls-key-file",
                str(self.tls_dir / "redis.key"),
            ]
        command += ["--requirepass", self.portal_password, *self.extra]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait_for(lambda: port_open(self.port), timeout=10) is None:
            self.stop()
            raise RuntimeError("the private redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """As after a crash or an upgrade: same port and password, every run-time ACL user gone."""
        self.stop()
        self.start()

    def admin(self, database: int | None = None) -> redis.Redis:
        """A client as the portal (all rights), for the test's own looks."""
        url = self.url.replace(f"/{self.database}", f"/{self.database if database is None else database}", 1)
        return redis.Redis.from_url(url, socket_timeout=5)


@contextmanager
def use_for_portal(settings: Any, broker: AclRedis, *, broker_users: bool = True) -> Iterator[None]:
    """The portal's broker (Celery's connection pool included) and the nodes' broker on ``broker``."""
    from portal.celery import app

    names = ("NODE_BROKER_USERS", "CELERY_BROKER_URL", "NODE_BROKER_URL", "AGENT_BROKER_URL")
    saved = {name: getattr(settings, name) for name in names}
    settings.NODE_BROKER_USERS = broker_users
    # One Redis for the portal's tasks and the nodes, as a lab that keeps one (the portal's Celery app reads
    # CELERY_BROKER_URL from the settings; the nodes' publisher and broker users NODE_BROKER_URL).
    settings.CELERY_BROKER_URL = settings.NODE_BROKER_URL = settings.AGENT_BROKER_URL = broker.url
    _forget_connections(app)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(settings, name, value)
        _forget_connections(app)


def _forget_connections(app: Any) -> None:
    """Drop the app's connection and producer pools (as Celery does after a fork), so that the next send
    connects to the broker URL now configured."""
    app._pool = None
    app.amqp._producer_pool = None


class Filled:
    """Connections that log in to a Redis with one credential until the server takes no more clients
    (``maxclients``): what a node holding its agent.conf can do, since Redis cannot cap a user's connections."""

    def __init__(self, port: int, *, username: str, password: str, limit: int = 10_000) -> None:
        self.sockets: list[socket.socket] = []
        self.refusal = b""
        while len(self.sockets) < limit:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            try:
                sock.sendall(f"AUTH {username} {password}\r\n".encode())
                reply = sock.recv(200)
            except ConnectionError as error:  # Redis wrote its refusal and closed before reading AUTH: a reset
                reply = repr(error).encode()
            if not reply.startswith(b"+OK"):
                self.refusal = reply
                sock.close()
                break
            self.sockets.append(sock)

    @property
    def full(self) -> bool:
        """Whether the server turned a client away for being full (the error, or the reset it closed with)."""
        return bool(self.sockets) and (b"max number of clients reached" in self.refusal or b"Reset" in self.refusal)

    def release(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets = []


def clients_of(admin: redis.Redis, username: str) -> list[dict[str, Any]]:
    """CLIENT LIST's entries for ``username``: the connections it holds now."""
    return [client for client in admin.client_list() if client.get("user") == username]
