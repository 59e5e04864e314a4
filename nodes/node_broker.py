"""The nodes' broker: the Redis the portal publishes lease snapshots to and the agents consume from.

Redis ACLs cannot cap connections per user: a node's broker credential, however narrow its grant, can open
connections until the server's ``maxclients``, after which that Redis refuses everyone. On the portal's own
Redis that would stop the portal's tasks, cache, channel layer and telemetry queue; on a Redis of the nodes'
own (``NODE_BROKER_URL``) it delays only lease pushes, which the agents' HTTPS pull already covers
(docs/agent.md, "A broker of the nodes' own").

So the portal reaches the nodes' broker only here and in nodes/broker_users.py, never through its own Celery
app: a Celery app of its own for the publishes, with short timeouts, a small connection pool and bounded
retries, so a broker that is full, away or black-holed makes a push fail within seconds, logged, and never
holds the portal's worker. Nothing a booking request runs touches it: a booking only queues its push on the
portal's own broker (reservations/pushes.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from celery import Celery
from django.conf import settings
from kombu.exceptions import KombuError
from kombu.utils.url import maybe_sanitize_url

# Seconds to connect and for each command. A push is one LPUSH of a few kilobytes: a Redis that needs longer is
# in no state to deliver it, and the pull brings the state instead.
TIMEOUT_SECONDS = 2
# Retries of one publish after a connection error (the first after a fresh connection, at once): a connection the
# pool kept from before a broker restart is replaced, while a broker that refuses costs at most a second more.
RETRIES = 2
RETRY_POLICY = {"max_retries": RETRIES, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
# Connections one portal process keeps open to the nodes' broker for publishing (docs/agent.md has the budget).
POOL_LIMIT = 2

# Names one machine's Redis may be reached by: a broker at localhost is the same server as one at 127.0.0.1.
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}  # noqa: S104 - names compared, nothing bound
_SOCKET_SCHEMES = {"unix", "redis+socket", "socket"}
_REDIS_SCHEMES = {"redis", "rediss"}


class NodeBrokerError(Exception):
    """A publish to the nodes' broker failed (refused, full, away, timed out); the message says where."""


@cache
def _app(url: str) -> Celery:
    """A Celery app that only publishes, one per broker URL (tests point the portal at brokers of their own)."""
    app = Celery("gpubook-node-broker", broker=url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        broker_pool_limit=POOL_LIMIT,
        broker_connection_timeout=TIMEOUT_SECONDS,
        broker_transport_options={"socket_timeout": TIMEOUT_SECONDS, "socket_connect_timeout": TIMEOUT_SECONDS},
        task_publish_retry=True,
        task_publish_retry_policy=RETRY_POLICY,
    )
    return app


def node_broker_app() -> Celery:
    """The app that publishes to NODE_BROKER_URL."""
    return _app(settings.NODE_BROKER_URL)


def shown_url() -> str:
    """NODE_BROKER_URL without its password, for messages."""
    return str(maybe_sanitize_url(settings.NODE_BROKER_URL))


def publish(*, task: str, args: list[Any], queue: str, expires: float) -> None:
    """Put one task message on ``queue`` of the nodes' broker, or raise NodeBrokerError within seconds.

    Straight to the key ``queue`` (the anonymous exchange: routing key = queue), with no priority: the agent
    reads that one key and nothing else (gpubook_agent/worker.py, AGENT_TRANSPORT_OPTIONS)."""
    try:
        node_broker_app().send_task(task, args=args, queue=queue, routing_key=queue, expires=expires, serializer="json")
    except (KombuError, redis.RedisError, OSError) as error:
        raise NodeBrokerError(f"the nodes' broker at {shown_url()} took no message for {queue}: {error}") from error


# --- which Redis server a URL names (for nodes.W004) -------------------------------------------------------------


def redis_server(url: str) -> tuple[str, str] | None:
    """The Redis server ``url`` names, as ("tcp", "host:port") with every loopback name one, or ("unix", path);
    None for a URL that is not Redis'. Database numbers are left out: they share one server's connections."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in _SOCKET_SCHEMES:
            return ("unix", unquote(parts.path))
        if scheme not in _REDIS_SCHEMES:
            return None
        host = (parts.hostname or "localhost").lower()
        port = parts.port or 6379
    except ValueError:  # a port that is no number: not a URL anyone connects with
        return None
    return ("tcp", f"{'loopback' if host in _LOOPBACK else host}:{port}")


def portal_redis_urls() -> Iterator[tuple[str, str]]:
    """(setting, URL) of each Redis the portal itself needs: its tasks, cache, channel layer, telemetry queue and
    push marks (REDIS_URL)."""
    yield "REDIS_URL", settings.REDIS_URL
    yield "CELERY_BROKER_URL", settings.CELERY_BROKER_URL
    yield "CHANNEL_LAYER_URL", settings.CHANNEL_LAYER_URL
    location = settings.CACHES.get("default", {}).get("LOCATION")
    if isinstance(location, str):
        yield "CACHE_URL", location


def portal_settings_sharing_the_node_broker() -> list[str]:
    """The settings whose Redis server is the nodes' broker's (none: the nodes have a Redis of their own)."""
    nodes = redis_server(settings.NODE_BROKER_URL)
    if nodes is None:
        return []
    return [name for name, url in portal_redis_urls() if redis_server(url) == nodes]
