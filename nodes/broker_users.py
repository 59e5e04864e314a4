"""A broker credential per node: a Redis ACL user that can take its own queue and nothing else.

With the portal's own broker URL in every agent's config, anyone holding one node's config could read,
pop or delete another node's snapshots, put tasks on the portal's queue, publish into the websocket
layer and FLUSHALL. So each node gets its own Redis user, ``node-<name>``, allowed exactly what the
agent's Celery consumer sends (found by watching it with MONITOR and ACL LOG; docs/agent.md, "The
broker")::

    ACL SETUSER node-<name> reset on #<sha256 of the password> ~node.<name> resetchannels -@all +ping +brpop

plus ``+select`` when the queues live in a database other than 0. ``~node.<name>`` is one exact key:
the agent keeps ``priority_steps=[0]`` (no priority sub-keys) and no ack emulation (no shared
``unacked*`` keys), and declares nothing (no ``_kombu.binding.*``). No ``+lpush``: the consumer never
hands a message back (solo pool, early acks), and a node that could push would be able to fill Redis.

The password is shown once, inside the BROKER_URL register_node prints. The node's row keeps its
SHA-256, which Redis takes in place of the password (``#<hex>``), so ``broker_users_sync`` re-creates
every user after Redis restarted without an ACL file: beat runs it every minute, scripts/run and
docker-compose at start. The passwords are 32 random bytes, so an unsalted hash gives nothing away.
Rotation sets the new password and then ends the connections already logged in with the old one,
which a password change alone would leave open.

The users live on the nodes' broker (NODE_BROKER_URL, nodes/node_broker.py: a Redis of the nodes' own, or by
default the portal's), and the portal manages them through its own connection to it, whose Redis user must
be allowed ``ACL`` and ``CLIENT KILL``. A nodes' broker a node has filled up (maxclients) refuses that
connection too: registering or rotating a node then fails and changes nothing, and beat's sync waits.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from django.conf import settings
from django.db import transaction
from kombu.utils.url import maybe_sanitize_url

from gpubook_agent.protocol import queue_name
from nodes.models import Node

log = logging.getLogger(__name__)

BROKER_USER_PREFIX = "node-"
REDIS_SCHEMES = ("redis", "rediss")
TIMEOUT_SECONDS = 5
# What the agent's consumer sends, and nothing more (docs/agent.md lists each command and why).
AGENT_COMMANDS = ("-@all", "+ping", "+brpop")
# What the portal's Redis user on the nodes' broker must be allowed for this module to work.
MANAGER_COMMANDS = (("ACL", "SETUSER"), ("ACL", "GETUSER"), ("ACL", "DELUSER"), ("CLIENT", "KILL"))
DISABLE_HINT = (
    "or set NODE_BROKER_USERS=false to give every node the portal's own credential for the nodes' broker "
    "(one node's config then opens every queue)"
)


class BrokerUserError(Exception):
    """The broker could not make or change a node's user; the message says why and what to do."""


def broker_username(node_name: str) -> str:
    return f"{BROKER_USER_PREFIX}{node_name}"


def new_password() -> str:
    return secrets.token_urlsafe(32)  # URL-safe: it goes into the BROKER_URL as it is


def password_hash(password: str) -> str:
    """The SHA-256 Redis ACLs compare a password with (``#<hex>``)."""
    return hashlib.sha256(password.encode()).hexdigest()


def agent_broker_url(*, node_name: str, password: str | None) -> str:
    """The BROKER_URL for a node's agent: AGENT_BROKER_URL with the node's user and password (or as it is,
    the portal's own credential, with ``password=None``)."""
    url = settings.AGENT_BROKER_URL
    if password is None:
        return url
    parts = urlsplit(url)
    address = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{broker_username(node_name)}:{password}@{address}"))


def broker_url_still_valid(node: Node, url: str) -> bool:
    """Whether ``url`` is the BROKER_URL ``node``'s agent was last given (the demo keeps such configs)."""
    if not settings.NODE_BROKER_USERS:
        return url == settings.AGENT_BROKER_URL and not node.broker_password_hash
    password = urlsplit(url).password or ""
    return (
        bool(password and node.broker_password_hash)
        and password_hash(password) == node.broker_password_hash
        and url == agent_broker_url(node_name=node.name, password=password)
    )


def redis_database(url: str) -> int:
    """The database number of a redis:// URL (its path; 0 without one)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def acl_rules(*, node_name: str, password_sha256: str) -> list[str]:
    """The whole of the node's user, from nothing (``reset``), so a re-run leaves exactly this.

    ``resetchannels`` comes after ``reset`` on purpose: with ``acl-pubsub-default allchannels`` a reset
    user may use every channel. ``+select`` only where needed: it lets the user pick any database, and
    the key pattern alone then keeps it to its own queue."""
    rules = ["reset", "on", f"#{password_sha256}", f"~{queue_name(node_name)}", "resetchannels", *AGENT_COMMANDS]
    if redis_database(settings.AGENT_BROKER_URL):
        rules.append("+select")
    return rules


def _shown(url: str) -> str:
    return str(maybe_sanitize_url(url))


def settings_problem() -> str | None:
    """What keeps per-node users from working whatever the server says, or None."""
    portal, agents = settings.NODE_BROKER_URL, settings.AGENT_BROKER_URL
    if urlsplit(portal).scheme not in REDIS_SCHEMES or urlsplit(agents).scheme not in REDIS_SCHEMES:
        return (
            "NODE_BROKER_USERS needs a Redis broker (redis:// or rediss://), and the nodes' broker is "
            f"{_shown(portal)} (the nodes: {_shown(agents)}): set NODE_BROKER_USERS=false and give each node a "
            "broker user of its own by hand (docs/agent.md, 'Other brokers')"
        )
    if redis_database(portal) != redis_database(agents):
        return (
            f"AGENT_BROKER_URL ({_shown(agents)}) names database {redis_database(agents)}, NODE_BROKER_URL "
            f"({_shown(portal)}) database {redis_database(portal)}: the nodes would watch queues nobody fills"
        )
    return None


@contextmanager
def _manager(action: str) -> Iterator[redis.Redis]:
    """The portal's own connection to the nodes' broker, with every failure turned into a BrokerUserError."""
    problem = settings_problem()
    if problem:
        raise BrokerUserError(problem)
    url = settings.NODE_BROKER_URL
    client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS)
    try:
        yield client
    except (redis.ConnectionError, redis.TimeoutError) as error:  # refused, timed out, or the portal's password refused
        raise BrokerUserError(f"cannot reach the broker at {_shown(url)} to {action}: {error}") from error
    except redis.ResponseError as error:
        raise BrokerUserError(_explain(error, url, action)) from error
    finally:
        client.close()


def _explain(error: redis.ResponseError, url: str, action: str) -> str:
    text = str(error)
    if isinstance(error, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        text = text if text.startswith("NOPERM") else f"NOPERM {text}"  # redis-py drops the error code
        return (
            f"the broker at {_shown(url)} does not let the portal's Redis user {action} ({text}): allow that user "
            f"ACL and CLIENT KILL (ACL SETUSER <user> +acl +client|kill, docs/agent.md), {DISABLE_HINT}"
        )
    if "unknown command" in text.lower() or "unknown subcommand" in text.lower():
        return (
            f"the broker at {_shown(url)} has no ACL users (Redis 6.2 or later has them): upgrade Redis, {DISABLE_HINT}"
        )
    return f"the broker at {_shown(url)} refused to {action}: {text}"


def broker_user_set(*, node_name: str, password_sha256: str, end_sessions: bool) -> None:
    """Create or replace ``node_name``'s user; ``end_sessions`` also disconnects whoever is logged in as it
    (rotation: ``ACL SETUSER`` changes the password for new logins only)."""
    username = broker_username(node_name)
    with _manager(f"create the broker user {username}") as client:
        # One MULTI/EXEC: a portal user allowed ACL but not CLIENT KILL aborts both at queue time, rather than
        # leaving a new password in Redis that nobody holds while the database rolls back.
        pipe = client.pipeline(transaction=True)
        pipe.execute_command(
            "ACL", "SETUSER", username, *acl_rules(node_name=node_name, password_sha256=password_sha256)
        )
        if end_sessions:
            pipe.execute_command("CLIENT", "KILL", "USER", username)
        pipe.execute()


def broker_user_delete(node_name: str) -> None:
    """Remove ``node_name``'s user; Redis disconnects its sessions with it."""
    username = broker_username(node_name)
    with _manager(f"remove the broker user {username}") as client:
        client.execute_command("ACL", "DELUSER", username)


def broker_users_forget(node_names: list[str]) -> None:
    """Once the deletion of these nodes commits, remove their users too. Best effort: a user left behind
    can take only the queue of a node nobody pushes to any more, and registering the name again replaces it."""
    if not settings.NODE_BROKER_USERS or not node_names:
        return

    def forget() -> None:
        for name in node_names:
            try:
                broker_user_delete(name)
            except BrokerUserError as error:
                log.warning("the deleted node %s keeps its broker user: %s", name, error)

    transaction.on_commit(forget)


def _as_mapping(reply: Any) -> dict[str, Any]:
    """ACL GETUSER's reply as {field: value}, text decoded: RESP3 sends a map, RESP2 a flat list."""
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, Mapping) else zip(reply[::2], reply[1::2], strict=True)
    return {_text(key): _decoded(value) for key, value in items}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decoded(value: Any) -> Any:
    return [_decoded(item) for item in value] if isinstance(value, list) else _text(value)


def _words(value: Any) -> set[str]:
    return {word for item in (value if isinstance(value, list) else [value]) for word in str(item).split()}


def _user_matches(reply: Any, *, node_name: str, password_sha256: str) -> bool:
    """Whether the user Redis has is exactly the one ``acl_rules`` makes (as Redis 7 reports it)."""
    user = _as_mapping(reply)
    if not user:
        return False
    rules = acl_rules(node_name=node_name, password_sha256=password_sha256)
    return (
        "on" in user.get("flags", [])
        and user.get("passwords") == [password_sha256]
        and _words(user.get("keys", "")) == {f"~{queue_name(node_name)}"}
        and _words(user.get("channels", "")) == set()
        and _words(user.get("commands", "")) == {rule for rule in rules if rule[0] in "+-"}
        and not user.get("selectors")
    )


@dataclass(frozen=True)
class SyncResult:
    checked: int = 0
    repaired: list[str] = field(default_factory=list)


def broker_users_sync() -> SyncResult:
    """Make every node's broker user what its stored hash says: re-create those Redis lost (a restart
    without an ACL file), put back those someone changed. Idempotent; nothing to do costs one round trip.

    Each repair re-reads the node's hash under its row lock, as rotation writes it: a sync that read the
    hash just before a rotation can never put the old password back."""
    if not settings.NODE_BROKER_USERS:
        return SyncResult()
    repaired = []
    with _manager("re-create the nodes' broker users") as client:
        nodes = list(
            Node.objects.exclude(broker_password_hash="")
            .order_by("name")
            .values_list("pk", "name", "broker_password_hash")
        )
        with client.pipeline(transaction=False) as pipe:
            for _, name, _ in nodes:
                pipe.execute_command("ACL", "GETUSER", broker_username(name))
            found = pipe.execute()
        for (pk, name, stored), reply in zip(nodes, found, strict=True):
            if _user_matches(reply, node_name=name, password_sha256=stored):
                continue
            with transaction.atomic():
                current = (
                    Node.objects.select_for_update().filter(pk=pk).values_list("name", "broker_password_hash").first()
                )
                if current is None or not current[1]:
                    continue
                client.execute_command(
                    "ACL",
                    "SETUSER",
                    broker_username(current[0]),
                    *acl_rules(node_name=current[0], password_sha256=current[1]),
                )
            repaired.append(current[0])
    if repaired:
        log.warning("re-created or repaired the broker users of %s", ", ".join(repaired))
    return SyncResult(checked=len(nodes), repaired=repaired)


@dataclass(frozen=True)
class BrokerProbe:
    """What the broker says about per-node users, for the system checks (nothing is changed)."""

    reachable: bool = True
    error: str = ""
    acl_supported: bool = True
    user: str = ""
    missing: list[str] = field(default_factory=list)  # commands the portal's user may not run
    default_user_open: bool = False  # Redis' default user is on and needs no password


def broker_probe() -> BrokerProbe:
    url = settings.NODE_BROKER_URL
    client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS)
    try:
        try:
            user = _text(client.execute_command("ACL", "WHOAMI"))
        except redis.ResponseError as error:
            if "unknown" in str(error).lower():
                return BrokerProbe(acl_supported=False, error=str(error))
            raise
        try:
            missing = [
                " ".join(command).lower()
                for command in MANAGER_COMMANDS
                if _text(client.execute_command("ACL", "DRYRUN", user, *command, *_probe_args(command))) != "OK"
            ]
        except redis.exceptions.NoPermissionError:
            missing = [" ".join(command).lower() for command in MANAGER_COMMANDS]
        except redis.ResponseError:  # Redis 6.2 has no DRYRUN: ask for something only ACL managers see
            try:
                client.execute_command("ACL", "GETUSER", user)
                missing = []
            except redis.exceptions.NoPermissionError:
                missing = [" ".join(command).lower() for command in MANAGER_COMMANDS]
        default_open = False
        if not missing:
            default = _as_mapping(client.execute_command("ACL", "GETUSER", "default"))
            default_open = "on" in default.get("flags", []) and "nopass" in default.get("flags", [])
        return BrokerProbe(user=user, missing=missing, default_user_open=default_open)
    except (redis.ConnectionError, redis.TimeoutError) as error:
        return BrokerProbe(reachable=False, error=str(error))
    finally:
        client.close()


def _probe_args(command: tuple[str, str]) -> tuple[str, ...]:
    return ("USER", "node-probe") if command == ("CLIENT", "KILL") else ("node-probe",)
